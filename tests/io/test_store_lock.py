"""``Store.lock``: a lock across processes in a real redis-server; the gate's (``renew``)
is kept for as long as its holder works, however long its paced GitHub calls take."""

from __future__ import annotations

import threading
import time

import pytest
from redis import Redis
from redis.exceptions import LockError

from bot.io.store import Store


def test_a_renewed_lock_outlives_its_timeout_while_held(redis: Redis) -> None:
    store = Store(redis)
    with store.lock("gate:a/b#1", timeout=0.6, renew=True):
        time.sleep(1.8)  # three timeouts
        # nobody else takes it meanwhile
        with pytest.raises(LockError), store.lock("gate:a/b#1", timeout=0.3):
            pass
    with store.lock("gate:a/b#1", timeout=0.3):  # released at the end: free again
        pass


def test_a_plain_lock_lapses_after_its_timeout(redis: Redis) -> None:
    """Without ``renew`` a holder that outlives the timeout loses the lock (a dead holder
    frees it); its release then says so in the log instead of failing the work done."""
    store = Store(redis)
    taken = threading.Event()

    def other() -> None:
        with store.lock("x", timeout=2):
            taken.set()

    with store.lock("x", timeout=0.4):
        time.sleep(0.6)
        t = threading.Thread(target=other)
        t.start()
        assert taken.wait(2)
        t.join()
