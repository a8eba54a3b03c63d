"""``loopbot doctor --config``: what loopbot makes of a repository's ``loop.yml``, within
the operator's ceilings. Apart from the host's checks (bot/ops/doctor.py): it reads a
file the operator names, not this machine."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path

from bot.core import repo_config
from bot.core.repo_config import Ceilings
from bot.core.schedules import slots, tasks
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
            Check(name, False, p, "fix the key named; see docs/loop-yml.md") for p in exc.problems
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
    checks.extend(schedule_checks(path, config))
    return checks


def schedule_checks(path: str, config: repo_config.RepoConfig) -> list[Check]:
    """Each schedule: when it runs next, and its task file as loopbot would read it, when
    ``path`` is a checkout's ``.github/loop.yml`` (the task files are beside it)."""
    checks = []
    root = _checkout_root(Path(path))
    now = time.time()
    for s in config.schedules:
        name = f"schedule {s.task}"
        when = f"`{s.cron}` (UTC), next {slots.iso(slots.following(s.cron, now))}"
        if root is None:
            checks.append(Check(name, True, f"{when}; task file not checked (not a checkout)"))
            continue
        file = root / s.task
        try:
            task = tasks.parse(s.task, file.read_text(encoding="utf-8") if file.exists() else None)
        except tasks.TaskError as exc:
            checks.extend(
                Check(name, False, p, "fix the task file; see docs/repositories.md#scheduled-loops")
                for p in exc.problems
            )
            continue
        except (OSError, UnicodeDecodeError) as exc:
            checks.append(Check(name, False, f"cannot be read: {exc}", "save it as UTF-8"))
            continue
        kind = "a metric loop" if task.kind == "metric" else "a fix loop"
        if task.kind == "metric" and task.settings.metric is None and config.metric is None:
            checks.append(
                Check(
                    name,
                    False,
                    "asks for a metric loop, and neither it nor loop.yml has a `metric:` section",
                    "add one",
                )
            )
            continue
        checks.append(Check(name, True, f"{when}: {kind}, {task.title!r}"))
    return checks


def _checkout_root(path: Path) -> Path | None:
    """The repository root of ``<root>/.github/loop.yml``; None for a file elsewhere."""
    resolved = path.resolve()
    if resolved.name == "loop.yml" and resolved.parent.name == ".github":
        return resolved.parent.parent
    return None


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
