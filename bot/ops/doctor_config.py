"""``loopbot doctor --config``: what loopbot makes of a repository's ``loop.yml``, within
the operator's ceilings. Apart from the host's checks (bot/ops/doctor.py): it reads a
file the operator names, not this machine."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from bot.core import repo_config
from bot.core.repo_config import Ceilings
from bot.core.settings import SettingsError, load_settings
from bot.ops.doctor import Check


def config_checks(path: str, text: str, ceilings: Ceilings) -> list[Check]:
    """What loopbot makes of one repository's ``loop.yml`` (``loopbot doctor --config``):
    each problem, each value the operator's ``ceilings`` lower, and what the file sets up
    (milestones, triage, a metric loop, a post-action) when it is valid."""
    name = f"config {path}"
    try:
        config, clamped = repo_config.load(text, ceilings)
    except repo_config.ConfigError as exc:
        return [
            Check(name, False, p, "fix the key named; see README, loop.yml") for p in exc.problems
        ]
    checks = [Check(name, True, note, warn=True) for note in clamped]
    labels = config.labels
    parts = [
        f"verify `{config.verify}`",
        f"milestones {config.milestones}",
        f"triage {'on' if config.triage.enabled else 'off'}",
        f"max_parallel {config.max_parallel}",
    ]
    if config.metric is not None:
        m = config.metric
        parts.append(
            f"metric loops on `{labels.optimize}`: {m.direction} `{m.command}` by at least "
            f"{m.min_delta:g}, guard `{m.guard or config.verify}`, scope {', '.join(m.scope)}, "
            f"{m.max_iterations} iterations, stop after {m.max_consecutive_discards} discards"
        )
    if config.post_action is not None:
        parts.append("a post-action turn after the final audit")
    checks.append(Check(name, True, "valid: " + "; ".join(parts)))
    return checks


def run_config_checks(paths: tuple[str, ...], env: Mapping[str, str] | None = None) -> list[Check]:
    """``loopbot doctor --config``: each file within the operator's ceilings when the
    settings load (LOOPBOT_MAX_* as the worker reads them), else the defaults, said so."""
    try:
        ceilings = Ceilings.of(load_settings(env, role="worker"))
        checks: list[Check] = []
    except SettingsError:
        ceilings = repo_config.DEFAULT_CEILINGS
        checks = [
            Check(
                "ceilings",
                True,
                "the settings do not load here, so the default ceilings apply "
                "(run `loopbot doctor` to see why)",
                warn=True,
            )
        ]
    for path in paths:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            checks.append(
                Check(f"config {path}", False, f"cannot be read: {exc}", "save it as UTF-8")
            )
            continue
        checks.extend(config_checks(path, text, ceilings))
    return checks
