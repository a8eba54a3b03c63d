"""The ``loopbot`` command: processes (web, worker) and operator tools."""

from __future__ import annotations

import multiprocessing
import sys
from pathlib import Path
from typing import Any

import click

from bot.core.ids import LoopId
from bot.core.record import Status
from bot.core.settings import (
    Role,
    Settings,
    SettingsError,
    env_file_path,
    environment,
    load_settings,
)
from bot.io.logs import configure, get_logger
from bot.io.queues import ALL_QUEUES, CONTROL_QUEUES
from bot.io.redis import RedisProblem, check, check_at_startup, connect

log = get_logger("loopbot.cli")


def _settings(role: Role) -> Settings:
    try:
        settings = load_settings(role=role)
    except SettingsError as exc:
        click.echo(f"loopbot: {exc}", err=True)
        raise SystemExit(2) from None
    configure(settings.log_format)
    return settings


@click.group()
@click.version_option(package_name="loopbot")
def main() -> None:
    """loopbot: turns well-specified GitHub issues into merged pull requests."""


@main.command()
@click.option("--host", default="0.0.0.0", show_default=True)
@click.option(
    "--port",
    envvar="PORT",
    default=8000,
    type=click.IntRange(1, 65535),
    show_default="$PORT or 8000",
    help="the port to listen on (also $PORT); a bad value is refused before anything starts",
)
@click.option("--workers", default=2, show_default=True, help="gunicorn worker processes")
@click.option(
    "--worker-class",
    type=click.Choice(["gevent", "sync"]),
    default="gevent",
    show_default=True,
    help="gunicorn worker class; under gevent a slow client holds a greenlet, not a worker",
)
def web(host: str, port: int, workers: int, worker_class: str) -> None:
    """Serve the webhook endpoint, /healthz and the dashboard (gunicorn)."""
    from gunicorn.app.base import BaseApplication

    from bot.web.serving import GUNICORN_SETTINGS
    from bot.web.startup import web_settings

    # Before gunicorn binds the port: a worker that cannot start would be started again,
    # for ever, with the port open.
    settings = web_settings()

    class _App(BaseApplication):  # type: ignore[misc]
        def load_config(self) -> None:
            self.cfg.set("bind", f"{host}:{port}")
            self.cfg.set("workers", workers)
            self.cfg.set("accesslog", None)
            for name, value in GUNICORN_SETTINGS.items():
                self.cfg.set(name, value)
            self.cfg.set("worker_class", worker_class)

        def load(self) -> Any:
            # In the worker, after gevent has patched the socket and threading modules,
            # so that the app's Redis pool is made of cooperative sockets and locks.
            from bot.web.app import create_app

            return create_app(settings)

    log.info("web.start", host=host, port=port, workers=workers, worker_class=worker_class)
    _App().run()


def _run_worker(
    settings: Settings, queues: list[str], burst: bool, scheduler: bool, reconcile: bool = False
) -> None:
    import jobs.entry  # noqa: F401 - registers the job functions this worker may run
    from bot.io.queues import make_worker
    from jobs.drain import DrainingWorker
    from jobs.reconciler import Reconciler
    from jobs.runtime import Runtime, install

    # As long as the connection's own retries: Redis may be starting alongside us.
    check_at_startup(settings.redis_url, "loopbot worker", wait=30)
    redis = connect(settings.redis_url)
    rt = install(Runtime(settings, redis))
    reconciler = Reconciler(rt) if reconcile and not burst else None
    if reconciler is not None:
        reconciler.start()  # first pass one interval from now: start-up changes no loop
    # On SIGTERM a running loop hands itself over instead of waiting to be killed. The
    # worker decodes only JSON and runs only loopbot's own job functions (bot.io.queues).
    worker = make_worker(queues, redis, DrainingWorker)
    _preload()  # once here, not again in every job's fork (bot/io/preload.py)
    try:
        worker.work(burst=burst, with_scheduler=scheduler, logging_level="WARNING")
    finally:
        if reconciler is not None:
            reconciler.close()  # its step in progress ends before the process does


def _preload() -> None:
    from bot.io.preload import preload

    missing = preload()
    if missing:  # a githubkit that renamed an endpoint: jobs import what they need
        log.warning("worker.preload_missing", endpoints=missing)


def _control_lane(settings: Settings) -> None:
    _run_worker(settings, list(CONTROL_QUEUES), burst=False, scheduler=False)


@main.command()
@click.option("--burst", is_flag=True, help="exit when the queues are empty")
@click.option(
    "--control-lane/--no-control-lane",
    default=True,
    show_default=True,
    help="also run a worker only for control commands, so /loop-cancel is "
    "handled while this worker runs a long loop",
)
@click.option(
    "--loops",
    type=click.IntRange(min=1, max=500),
    default=1,
    show_default=True,
    envvar="LOOPBOT_WORKER_LOOPS",
    show_envvar=True,
    help="loops this machine runs at once: one worker process per loop slot, "
    "under one supervisor, with one control lane",
)
def worker(burst: bool, control_lane: bool, loops: int) -> None:
    """Run RQ workers on loopbot's queues, with the scheduler and the reconciler."""
    settings = _settings("worker")
    check_at_startup(settings.redis_url, "loopbot worker", wait=30)
    from jobs.sandbox.bwrap import availability_problem

    problem = availability_problem(settings)
    if problem:
        click.echo(f"loopbot worker: {problem}", err=True)
        raise SystemExit(2)
    if loops > 1:
        raise SystemExit(_supervise(settings, loops, burst=burst, control_lane=control_lane))
    lane = None
    if control_lane and not burst:
        # Forked once the job code is imported and preloaded, as the supervisor forks its
        # children (bot/ops/supervisor.py): the lane starts with all of it done, sharing
        # its pages, instead of importing it all again (a spawned lane did: about 2.7 s of
        # CPU per worker start). Safe to fork here: this process has no thread yet (the
        # reconciler starts in _run_worker) and no open Redis connection (the start-up
        # check closes its probe); the lane makes its own Runtime and connection.
        import jobs.entry  # noqa: F401 - registers the job functions both workers run

        _preload()
        lane = multiprocessing.get_context("fork").Process(
            target=_control_lane, args=(settings,), daemon=True, name="loopbot-control-lane"
        )
        lane.start()
    try:
        log.info("worker.start", queues=list(ALL_QUEUES), burst=burst)
        _run_worker(settings, list(ALL_QUEUES), burst=burst, scheduler=True, reconcile=True)
    finally:
        if lane is not None:
            lane.terminate()
            lane.join(10)


def _supervise(settings: Settings, loops: int, *, burst: bool, control_lane: bool) -> int:
    """``--loops N``: N loop slots (slot 0 with the scheduler and the reconciler) and the
    control lane, forked from this process once the job code is imported."""
    import functools

    import jobs.entry  # noqa: F401 - imported once here, shared by every forked slot
    from bot.ops.supervisor import Child, Supervisor

    _preload()  # before the slots fork: each starts with it done, and shares its pages

    def slot(index: int) -> None:
        _run_worker(
            settings, list(ALL_QUEUES), burst=burst, scheduler=index == 0, reconcile=index == 0
        )

    children = [Child(f"loopbot-slot-{i}", functools.partial(slot, i)) for i in range(loops)]
    if control_lane and not burst:
        lane = functools.partial(
            _run_worker, settings, list(CONTROL_QUEUES), burst=False, scheduler=False
        )
        children.append(Child("loopbot-control-lane", lane))
    log.info("worker.start", queues=list(ALL_QUEUES), burst=burst, loops=loops)
    return Supervisor(children, restart=not burst).run()


# -- operator tools ---------------------------------------------------------------------


def _redis_only() -> Any:
    """Status, events and cancel need only Redis, not the App's credentials: REDIS_URL,
    or REDIS_SENTINELS and REDIS_SENTINEL_MASTER (read as settings read them)."""
    from bot.core.redis_url import effective_url

    try:
        url = effective_url(environment())
    except ValueError as exc:  # its message names the variable, never a password
        click.echo(f"loopbot: cannot read Redis: {exc}", err=True)
        raise SystemExit(2) from None
    try:
        check(url, timeout=5)
    except RedisProblem as exc:
        click.echo(f"loopbot: cannot read Redis: {exc}", err=True)
        raise SystemExit(1) from None
    return connect(url, retries=1, timeout=5)


def _loop_ref(value: str) -> LoopId:
    try:
        return LoopId.parse(value)
    except ValueError:
        raise click.BadParameter(f"expected OWNER/REPO#NUMBER, got {value!r}") from None


@main.command()
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@click.option(
    "--limit", default=100, show_default=True, type=click.IntRange(min=0), help="0 shows all"
)
@click.option(
    "--status",
    "only",
    type=click.Choice([s.value for s in Status]),
    help="only loops with this status",
)
def status(as_json: bool, limit: int, only: str | None) -> None:
    """Loops, newest first: status, phase, turn, cost and pull request."""
    import json

    from redis.exceptions import RedisError

    from bot.io.store import Store

    try:
        found, total = Store(_redis_only()).recent(limit or 10**9, 0, only)
    except RedisError as exc:
        click.echo(f"loopbot: cannot read Redis: {exc}", err=True)
        raise SystemExit(1) from None
    if as_json:
        click.echo(json.dumps(found, indent=2))
        return
    if not found:
        click.echo(f"no {only} loops" if only else "no loops yet")
        return
    rows = [("LOOP", "STATUS", "PHASE", "TURN", "COST", "PR", "REASON")]
    for r in found:
        rows.append(
            (
                r["key"],
                r["status"],
                r["phase"],
                f"{r['turn']}/{r['max_turns']}",
                f"${r['cost_usd']:.2f}",
                f"#{r['pr_number']}" if r["pr_number"] else "-",
                r["reason"] or "-",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    # What a waiting loop waits for, under its row: the words of its status comment.
    waits = ["", *(str(r.get("waiting_for") or "") for r in found)]
    for row, wait in zip(rows, waits, strict=True):
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
        if wait:
            click.echo(f"  ↳ {wait}")
    if total > len(found):
        click.echo(f"({total - len(found)} older not shown; --limit 0 shows all)")


@main.command()
@click.option("--since", default="7d", show_default=True, help="loops labelled within: 7d, 12h")
@click.option("--repo", default=None, help="one repository (OWNER/NAME) only")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "csv", "json"]),
    default="table",
    show_default=True,
)
def report(since: str, repo: str | None, fmt: str) -> None:
    """What loops cost, per repository and in total: outcomes, dollars and tokens by
    backend and model, cost and turns per merged pull request, label to merge."""
    import time

    from redis.exceptions import RedisError

    from bot.core.spend.report import parse_since
    from bot.core.spend.report import report as build
    from bot.io.store import Store

    try:
        window = parse_since(since)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--since") from None
    try:
        store = Store(_redis_only())
        records = [*store.all(), *store.archived()]  # archived: past LOOPBOT_RETENTION_DAYS
    except RedisError as exc:
        click.echo(f"loopbot: cannot read Redis: {exc}", err=True)
        raise SystemExit(1) from None
    built = build(records, time.time() - window, repo)
    if fmt == "json":
        click.echo(built.to_json())
    elif fmt == "csv":
        click.echo(built.to_csv(), nl=False)
    else:
        click.echo(built.to_table())


@main.command()
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def schedules(as_json: bool) -> None:
    """Each repository's schedules: cron, last slot and its outcome, next slot."""
    import json
    import time

    from redis.exceptions import RedisError

    from bot.core.schedules.slots import iso
    from bot.io.schedules import overview

    try:
        rows = overview(_redis_only(), time.time())
    except RedisError as exc:
        click.echo(f"loopbot: cannot read Redis: {exc}", err=True)
        raise SystemExit(1) from None
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo("no schedules (none in any repository's loop.yml, or none read yet)")
        return
    table = [("REPO", "TASK", "CRON (UTC)", "LAST", "OUTCOME", "NEXT")]
    errors = []
    for r in rows:
        if r["error"]:
            errors.append(f"{r['repo']}: loop.yml is not valid, no schedule runs: {r['error']}")
            continue
        outcome = r["outcome"] or "-"
        if r["issue"]:
            outcome += f" #{r['issue']}"
        if r["loop_status"]:
            outcome += f" ({r['loop_status']}{', ' + r['loop_reason'] if r['loop_reason'] else ''})"
        elif r["detail"]:
            outcome += f" ({r['detail'][:80]})"
        last = iso(r["last_slot"]) if r["last_slot"] is not None else "-"
        table.append((r["repo"], r["task"], r["cron"], last, outcome, iso(r["next"])))
    if len(table) > 1:
        widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
        for row in table:
            click.echo("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    for line in errors:
        click.echo(line)


@main.command()
@click.argument("loop", required=False)
@click.option("-n", "--lines", default=20, show_default=True, help="how many past events")
@click.option("-f", "--follow", is_flag=True, help="keep printing new events")
def events(loop: str | None, lines: int, follow: bool) -> None:
    """Events of one loop (OWNER/REPO#N) or of all loops."""
    import time

    from bot.io.store import Store

    key = None
    if loop:
        key = _loop_ref(loop).key
    store = Store(_redis_only())
    past = store.events(key, count=100_000)[-lines:] if lines else []
    for e in past:
        click.echo(_event_line(e))
    last = past[-1]["id"] if past else "$"
    while follow:
        for e in store.follow(key, last, block_ms=1000):
            click.echo(_event_line(e))
            last = e["id"]
        time.sleep(0)


def _event_line(e: dict[str, Any]) -> str:
    import datetime as dt

    at = dt.datetime.fromtimestamp(e["at"], tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
    data = " ".join(f"{k}={v}" for k, v in e["data"].items())
    return f"{at}  {e['loop']:<28} {e['kind']:<16} {data}"


@main.command(name="log")
@click.argument("loop")
@click.option("-f", "--follow", is_flag=True, help="keep printing new entries until the loop ends")
@click.option("--full", is_flag=True, help="whole bodies, not their head and tail")
def session_log(loop: str, follow: bool, full: bool) -> None:
    """The session log of one loop (OWNER/REPO#N): each turn's commands, edits, their
    output, verify runs and review rounds, with secrets redacted."""
    import time

    from bot.core.text import sessionlog
    from bot.core.text.redact import Redactor, settings_secrets
    from bot.io.store import Store

    key = _loop_ref(loop).key
    # The settings, not only REDIS_URL: the redaction needs the worker's secret values.
    settings = _settings("cli")
    check_at_startup(settings.redis_url, "loopbot log")
    store = Store(connect(settings.redis_url))
    redact = Redactor(settings_secrets(settings))
    max_chars = FULL_LOG_CHARS if full else 4000
    shown: set[str] = set()

    def show_new() -> bool:
        """Print the entries not printed yet; whether the loop is still active."""
        record = store.get(key)
        if record is None:
            click.echo(f"{key}: no such loop", err=True)
            raise SystemExit(1)
        events = store.events(key, count=100_000)
        entries = sessionlog.build(store.conversation(key), events, redact, max_chars=max_chars)
        # A turn's messages are saved when it ends and slot in before entries printed
        # already: print each entry once, by its content, wherever it lands.
        ids = _entry_ids(entries)
        new = [e for e, i in zip(entries, ids, strict=True) if i not in shown]
        shown.update(ids)
        if new:
            click.echo(sessionlog.render_text(new, full=full))
        return record.active

    last = "$"
    try:
        active = show_new()
        while follow and active:
            found = store.follow(key, last, block_ms=1000)
            if found:
                last = found[-1]["id"]
            active = show_new()
            time.sleep(0 if found else 0.5)
    except KeyboardInterrupt:
        return
    if follow:
        record = store.get(key)
        click.echo(f"\n{key}: {record.status.value if record else 'gone'}")


FULL_LOG_CHARS = 1_000_000  # of one entry with --full: whole, within reason


def _entry_ids(entries: list[dict[str, Any]]) -> list[str]:
    """An id per entry: its content, and how many equal entries came before it (the same
    command run twice in a step is two entries)."""
    import hashlib
    import json

    seen: dict[str, int] = {}
    ids = []
    for entry in entries:
        raw = json.dumps(entry, sort_keys=True, separators=(",", ":"))
        digest = hashlib.sha256(raw.encode()).hexdigest()
        seen[digest] = seen.get(digest, 0) + 1
        ids.append(f"{digest}/{seen[digest]}")
    return ids


@main.command()
@click.argument("loop")
def cancel(loop: str) -> None:
    """Cancel a loop (OWNER/REPO#N); its branch and worktree are kept."""
    # The jobs a cancel may enqueue: the slot it frees goes to a waiting loop (its loop job)
    # or a waiting gate (its gate job). Without them registered, that loop held the slot
    # with no job until the reconciler's lapse (a red team's finding).
    import jobs.entry  # noqa: F401
    from bot.core.record import Reason
    from jobs import lifecycle

    loop_id = _loop_ref(loop)
    result = lifecycle.cancel(_redis_only(), loop_id.key, Reason.CANCELLED, "cli")
    click.echo(f"{loop_id}: {result}")
    if result == "no loop":
        raise SystemExit(1)


@main.command()
@click.argument("loop")
def restart(loop: str) -> None:
    """Resume a loop that is not completed (OWNER/REPO#N)."""
    import jobs.entry  # noqa: F401 - registers the loop job this command enqueues
    from jobs.dispatch import start_loop
    from jobs.runtime import Runtime

    loop_id = _loop_ref(loop)
    settings = _settings("cli")
    check_at_startup(settings.redis_url, "loopbot restart")
    rt = Runtime(settings, connect(settings.redis_url))
    record = rt.store.get(loop_id.key)
    if record is None:
        click.echo(f"{loop_id}: no such loop", err=True)
        raise SystemExit(1)
    gh = rt.github.installation(record.installation_id)
    config = rt.config(gh, loop_id.repo)
    result = start_loop(
        rt, loop_id.repo, loop_id.issue, record.installation_id, "cli", config, restart=True
    )
    click.echo(f"{loop_id}: {result}")
    if result not in ("restarted", "started"):
        raise SystemExit(1)


@main.command()
@click.option(
    "--config",
    "configs",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False),
    help="check this loop.yml instead (repeatable), within the operator's ceilings",
)
@click.option(
    "--github",
    "live_app",
    is_flag=True,
    help="check the live App instead: each installation's permissions and events, the "
    "webhook URL and GitHub's recent failed deliveries",
)
def doctor(configs: tuple[str, ...], live_app: bool) -> None:
    """Check settings, Redis, the App's credentials, git, bubblewrap and the model."""
    from bot.ops.doctor import run_checks
    from bot.ops.doctor_config import run_config_checks
    from bot.ops.doctor_github import run_github_checks

    if configs and live_app:
        raise click.UsageError("--config and --github check different things: give one")
    if live_app:
        checks = run_github_checks()
    else:
        checks = run_config_checks(configs) if configs else run_checks()
    for c in checks:
        click.echo(c.line())
    failed = sum(1 for c in checks if not c.ok)
    click.echo(f"{len(checks) - failed} passed, {failed} failed")
    if failed:
        raise SystemExit(1)


@main.group()
def app() -> None:
    """The GitHub App itself: register it."""


@app.command(name="create")
@click.option(
    "--url",
    required=True,
    help="where GitHub reaches loopbot web (https://HOST); the webhook is URL/webhook",
)
@click.option("--org", help="register the App for this organization (default: your account)")
@click.option("--name", help="the App's name on GitHub (default: app.yml's, loopbot)")
@click.option(
    "--env-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="where to write the credentials [default: $LOOPBOT_ENV_FILE or .env]",
)
@click.option(
    "--port", default=0, show_default="any free port", help="the local page's port on 127.0.0.1"
)
@click.option("--no-browser", is_flag=True, help="print the local page's address only")
@click.option("--force", is_flag=True, help="replace an App already in the env file")
@click.option(
    "--timeout", default=3600.0, show_default=True, help="seconds to wait (GitHub allows an hour)"
)
def app_create(
    url: str,
    org: str | None,
    name: str | None,
    env_file: Path | None,
    port: int,
    no_browser: bool,
    force: bool,
    timeout: float,
) -> None:
    """Register the GitHub App from loopbot's manifest (app.yml) in one step, and write
    its id, private key and webhook secret to the env file that web and worker read.

    GitHub Enterprise Server: set GITHUB_API_URL=https://HOST/api/v3 first."""
    from bot.ops import app_create as flow
    from bot.ops.manifest import ManifestError

    env = environment()
    path = env_file or env_file_path(env)
    api_url = env.get("GITHUB_API_URL") or flow.DEFAULT_API_URL
    try:
        flow.check_options(api_url, url, org, name)
    except ManifestError as exc:
        raise click.UsageError(str(exc)) from None
    if flow.already_registered(path) and not force:
        click.echo(
            f"loopbot app create: {path} already names an App (GITHUB_APP_ID); --force replaces it",
            err=True,
        )
        raise SystemExit(1)
    code = flow.run(
        api_url=api_url,
        site_url=url,
        org=org,
        name=name,
        env_file=path,
        port=port,
        open_browser=not no_browser,
        timeout=timeout,
        out=sys.stdout,
    )
    raise SystemExit(code)


@main.command()
@click.option("--keep", is_flag=True, help="leave the demo running until Ctrl-C")
@click.option(
    "--story",
    type=click.Choice(["fix", "metric"]),
    default="fix",
    show_default=True,
    help="fix: a labelled bug fixed, reviewed, merged; metric: a metric loop (loop:optimize) "
    "keeping one change and discarding two",
)
def demo(keep: bool, story: str) -> None:
    """Run the whole story locally: label → loop → review → merge, no accounts needed."""
    from bot.ops.demo import run_demo

    raise SystemExit(run_demo(keep=keep, story=story))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
