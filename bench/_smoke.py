"""``--smoke``: each benchmark's quick mode, which tests/io/test_bench_smoke.py runs in CI.

A smoke run swaps the benchmark's defaults for tiny ones (arguments given explicitly
still win), so that the whole set takes seconds. It prints the same figures, which then
mean nothing (tiny inputs on a busy machine), and no target is checked; what it shows is
that the benchmark still runs to the end against the current code. Like a full run, it
exits non-zero when anything failed.
"""

from __future__ import annotations

import argparse


def parse(ap: argparse.ArgumentParser, **smoke: object) -> argparse.Namespace:
    """Parse the command line, with ``smoke`` as the defaults when ``--smoke`` is given."""
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="a quick run that checks the benchmark still works; its figures mean nothing "
        f"(sets {', '.join(f'{k}={v}' for k, v in smoke.items())})",
    )
    # A first pass only to learn whether --smoke is there: defaults must be set before
    # the real parse, so that an explicit argument overrides the smoke default.
    if ap.parse_known_args()[0].smoke:
        ap.set_defaults(**smoke)
    return ap.parse_args()
