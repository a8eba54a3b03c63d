"""Shared set-up for the benchmarks: private Redis, local GitHub and model, a runtime."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from redis import Redis

from bot.core.settings import load_settings
from bot.standins.anthropic import AnthropicServer
from bot.standins.github import GitHubServer
from bot.standins.redis_server import RedisServer
from jobs.runtime import Runtime, install


@dataclass
class Bench:
    root: Path
    redis_server: RedisServer
    github: GitHubServer
    model: AnthropicServer
    env: dict[str, str]
    rt: Runtime

    def close(self) -> None:
        self.github.stop()
        self.model.stop()
        self.redis_server.stop()


def start(extra: dict[str, str] | None = None) -> Bench:
    root = Path(tempfile.mkdtemp(prefix="loopbot-bench-"))
    redis_server = RedisServer().start()
    github = GitHubServer(root / "github").start()
    model = AnthropicServer().start()
    env = {
        "REDIS_URL": redis_server.url,
        "GITHUB_APP_ID": str(github.app_id),
        "GITHUB_PRIVATE_KEY": github.private_key_pem,
        "GITHUB_WEBHOOK_SECRET": github.webhook_secret,
        "GITHUB_API_URL": github.url,
        "ANTHROPIC_API_KEY": "sk-ant-bench",
        "ANTHROPIC_BASE_URL": model.url,
        "LOOPBOT_DATA_DIR": str(root / "data"),
        "LOOPBOT_LOG_FORMAT": "json",
        # The local GitHub has no secondary limit here: a pause between writes would be
        # counted as orchestration overhead (the pace is measured on its own).
        "LOOPBOT_GITHUB_WRITE_GAP": "0",
        **(extra or {}),
    }
    settings = load_settings(env, role="worker")
    rt = install(Runtime(settings, Redis.from_url(redis_server.url)))
    return Bench(root, redis_server, github, model, env, rt)
