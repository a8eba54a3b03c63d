"""The formats one release writes to Redis and another reads: jobs and loop records.

A rolling deploy runs two releases on one Redis for a while: the new one started beside
the old, the old stopped with SIGTERM (its loops hand themselves over, jobs/drain.py).
What either writes, the other may read. So each format carries a number, and:

**Jobs.** A job's format is the queue it is on, the function it names and the arguments
it passes (bot/io/queues.py, jobs/entry.py). Format 1 is release 0.1.0's:
``loopbot-control`` and ``loopbot-loops``; ``jobs.dispatch.handle_command(command_json)``,
``jobs.loop.run_loop(repo, issue)``, ``jobs.critic.run_critic(repo, issue)`` and
``jobs.merge_gate.run_gate(repo, issue)`` (tests/io/test_formats.py pins them). These are
wire names: the functions have moved into jobs/'s rooms since, and a worker runs the one
registered for the name (``bot.io.queues.WIRE_NAMES``), never an import of it.
A release that changes any of these bumps ``JOB_FORMAT``, and its queues take the suffix
``-v{N}``: an older worker never listens there, so it never runs a job it does not know.
A newer worker also works the queues of every older format it still reads
(``JOB_FORMATS_READ``), so nothing queued before the deploy is left behind. Every job also
carries its format in its meta; a worker refuses one newer than it knows (fail closed).

**Records.** A loop record carries ``format`` (absent: 1, as release 0.1.0 wrote it).
Within a format, fields are only ever added, each with a default, so a record written by
either release reads in the other. A release that must change a field's meaning bumps
``RECORD_FORMAT``; a worker then refuses to rewrite a record newer than it knows
(``NewerFormat``) rather than drop the fields it cannot read, and the job is retried, by
then on a newer worker.
"""

from __future__ import annotations

JOB_FORMAT = 1
JOB_FORMATS_READ = (1,)  # the formats this release's workers run, newest first
RECORD_FORMAT = 1


class NewerFormat(Exception):
    """Data written by a newer release than this one: left alone, never rewritten."""


def queue_name(base: str, job_format: int = JOB_FORMAT) -> str:
    """The queue ``base`` of a job format: format 1 keeps release 0.1.0's names."""
    if job_format < 1:
        raise ValueError(f"no job format {job_format}")
    return base if job_format == 1 else f"{base}-v{job_format}"


def job_format_problem(meta: object) -> str | None:
    """Why a worker of this release must not run a job with this meta, or None."""
    found = meta.get("format", 1) if isinstance(meta, dict) else 1
    if not isinstance(found, int) or isinstance(found, bool) or found < 1:
        return f"its job format {found!r} is not one loopbot writes"
    if found not in JOB_FORMATS_READ:
        return (
            f"it was written by another release (job format {found}; this worker runs "
            f"{', '.join(map(str, JOB_FORMATS_READ))})"
        )
    return None


def check_record_format(found: int) -> None:
    """Raise ``NewerFormat`` for a record this release must not rewrite."""
    if found > RECORD_FORMAT:
        raise NewerFormat(
            f"the loop record was written by a newer release (format {found}; this one "
            f"writes {RECORD_FORMAT}): left for a newer worker"
        )
