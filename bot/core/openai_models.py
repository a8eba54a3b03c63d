"""What loopbot knows of OpenAI's models, for the codex backend (``jobs/agents/codex.py``).

OpenAI's Models API names a model but does not describe it (no context window, output
limit or reasoning levels), so these come from a table: the windows and reasoning levels
the pinned Codex CLI's own model catalogue gives (``@openai/codex`` 0.169.0), the output
limit OpenAI's model pages list. A model not in the table gets the operator's fallback
window (``LOOPBOT_CONTEXT_WINDOW``), a 32K output limit and no reasoning level: nothing
sent that the API might refuse.
"""

from __future__ import annotations

from bot.core.models import ModelSpec

# Codex works within this window by default (its catalogue's ``context_window``) and
# compacts the conversation before it is full.
_WINDOW = 272_000
_OUTPUT = 128_000
_ALL = frozenset({"low", "medium", "high", "xhigh", "max"})

SPECS: dict[str, ModelSpec] = {
    spec.id: spec
    for spec in (
        ModelSpec("gpt-6.1-sol", _WINDOW, _OUTPUT, adaptive=False, efforts=_ALL),
        ModelSpec("gpt-6.1-terra", 500_000, _OUTPUT, adaptive=False, efforts=_ALL),
        ModelSpec("gpt-6-astra", _WINDOW, _OUTPUT, adaptive=False, efforts=_ALL),
        ModelSpec("gpt-6-sol", _WINDOW, _OUTPUT, adaptive=False, efforts=_ALL),
        ModelSpec("gpt-6-luna", _WINDOW, _OUTPUT, adaptive=False, efforts=_ALL),
        ModelSpec("gpt-5.6-sol", _WINDOW, _OUTPUT, adaptive=False, efforts=_ALL),
        ModelSpec("gpt-5.6-terra", _WINDOW, _OUTPUT, adaptive=False, efforts=_ALL),
        ModelSpec("gpt-5.6-luna", _WINDOW, _OUTPUT, adaptive=False, efforts=_ALL),
        ModelSpec(
            "gpt-5.5",
            _WINDOW,
            _OUTPUT,
            adaptive=False,
            efforts=frozenset({"low", "medium", "high", "xhigh"}),
        ),
    )
}
FALLBACK_OUTPUT = 32_000


def spec(model: str, fallback_window: int) -> ModelSpec:
    """``model``'s spec from the table, or a guess that sends nothing it might refuse."""
    known = SPECS.get(model)
    if known is not None:
        return known
    return ModelSpec(
        model, fallback_window, FALLBACK_OUTPUT, adaptive=False, efforts=frozenset(), known=False
    )
