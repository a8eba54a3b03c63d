"""Red team of b53b70b (preload in the worker): a preload failure must never stop a
worker from starting."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bot.io import preload


@pytest.fixture
def fresh_tls() -> Iterator[None]:
    preload.tls.cache_clear()
    yield
    preload.tls.cache_clear()


def test_redteam_push_preload_with_an_unreadable_ca_file_does_not_stop_the_worker(
    fresh_tls: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``SSL_CERT_FILE`` naming a file that is not there (or not a CA bundle): the worker
    starts, as it did before the preload (each GitHub client fails alone, at its first
    request). (Found by the red team: ``_preload()``, before ``worker.work`` and before
    the slots fork, raised from ``tls()`` and the worker died at its start.)"""
    from bot.ops import cli

    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "missing-ca.pem"))
    cli._preload()  # must not raise: a worker starts whatever preload meets
    assert preload.tls() is True  # each client builds its own, and fails as httpx does


def test_redteam_push_preload_with_a_bad_ca_bundle_does_not_stop_the_worker(
    fresh_tls: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bot.ops import cli

    bad = tmp_path / "ca.pem"
    bad.write_text("not a certificate\n")
    monkeypatch.setenv("SSL_CERT_FILE", str(bad))
    cli._preload()
