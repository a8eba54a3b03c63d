"""A loop's total cost and tokens in one line, as the merge receipt, the status comment's
last line and the pull request's body say it."""

from __future__ import annotations

from bot.core.record import LoopRecord


def total(record: LoopRecord) -> str:
    """``Loop total: $0.1234 · 56,789 tokens (input …, output …, cache read …, cache
    write …)``: every call of the loop's life, every role."""
    u = record.usage.values()
    i, o = sum(x.input_tokens for x in u), sum(x.output_tokens for x in u)
    r, w = sum(x.cache_read_tokens for x in u), sum(x.cache_write_tokens for x in u)
    return (
        f"Loop total: ${record.cost_usd:.4f} · {i + o + r + w:,} tokens (input {i:,}, "
        f"output {o:,}, cache read {r:,}, cache write {w:,})"
    )
