"""Spend above the loop: the operator's caps per repository and installation, per day and
per month (``caps``), and the report of what loops cost (``report``). Pure rules over
plain values; the counters live in Redis (``bot.io.spend``), the gate before each model
call in the worker (``jobs.spend``)."""
