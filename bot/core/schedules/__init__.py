"""Scheduled loops (``schedules:`` in ``.github/loop.yml``): the pure decisions.

``slots``: which slot of a cron expression is due now, and the catch-up rule; ``tasks``:
what a task file (``.github/loop-tasks/<name>.md``) asks for. The I/O is in
``bot/io/schedules.py`` (the Redis book) and ``jobs/schedules.py`` (the reconciler's step).
"""
