"""POST /webhook and /healthz against the real app, a real Redis and the real routing."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from redis import Redis
from rq.job import Job

from bot.core import signature
from bot.core.settings import Settings
from bot.io.queues import CONTROL_QUEUE, body_key, command_job_id
from bot.web.app import create_app

SECRET = "local-webhook-secret"  # the local GitHub server's default


def labeled(sender_type: str = "User", login: str = "alice") -> dict[str, Any]:
    return {
        "action": "labeled",
        "issue": {"number": 1},
        "label": {"name": "loop:ready"},
        "sender": {"login": login, "type": sender_type},
        "installation": {"id": 5},
        "repository": {"full_name": "acme/widgets"},
    }


def post(
    client: Any,
    payload: Any,
    *,
    event: str = "issues",
    delivery: str = "d-1",
    secret: str = SECRET,
    raw: bytes | None = None,
    headers: dict[str, str | None] | None = None,
) -> Any:
    body = raw if raw is not None else json.dumps(payload).encode()
    h: dict[str, str | None] = {
        "X-GitHub-Event": event,
        "X-GitHub-Delivery": delivery,
        "X-Hub-Signature-256": signature.sign(secret, body),
        "Content-Type": "application/json",
    }
    h.update(headers or {})
    return client.post("/webhook", data=body, headers={k: v for k, v in h.items() if v is not None})


def queued(redis: Redis) -> int:
    return int(redis.llen(f"rq:queue:{CONTROL_QUEUE}"))


@pytest.fixture
def client(settings: Settings, redis: Redis) -> Any:
    return create_app(settings, redis).test_client()


def test_accepted_delivery_is_enqueued_with_202(client: Any, redis: Redis) -> None:
    resp = post(client, labeled())
    assert resp.status_code == 202
    assert resp.json["status"] == "queued"
    assert queued(redis) == 1


def test_bad_or_missing_signature_is_401_and_enqueues_nothing(client: Any, redis: Redis) -> None:
    assert post(client, labeled(), secret="wrong").status_code == 401
    assert post(client, labeled(), headers={"X-Hub-Signature-256": None}).status_code == 401
    assert queued(redis) == 0


def test_missing_headers_or_non_json_is_400(client: Any, redis: Redis) -> None:
    assert post(client, labeled(), headers={"X-GitHub-Event": None}).status_code == 400
    assert post(client, labeled(), headers={"X-GitHub-Delivery": None}).status_code == 400
    assert post(client, None, raw=b"{not json").status_code == 400
    assert post(client, None, raw=b"\xff\xfe").status_code == 400
    assert queued(redis) == 0


def test_oversized_body_is_413(client: Any, redis: Redis) -> None:
    big = b"{" + b" " * (25 * 1024 * 1024) + b"}"
    assert post(client, None, raw=big).status_code == 413
    assert queued(redis) == 0


def test_ping_is_200(client: Any) -> None:
    assert post(client, {"zen": "Keep it simple"}, event="ping").status_code == 200


def test_same_delivery_100_times_enqueues_once(client: Any, redis: Redis) -> None:
    statuses = [post(client, labeled(), delivery="same").json["status"] for _ in range(100)]
    assert statuses.count("queued") == 1 and statuses.count("duplicate") == 99
    assert queued(redis) == 1
    # The dedupe record is the command job, named after the delivery; it is kept for
    # longer than GitHub's 3-day redelivery window after it ran.
    from bot.io.queues import fetch_job

    kept = fetch_job("cmd-same", redis).result_ttl
    assert kept is not None and kept >= 3 * 24 * 3600


def test_odd_delivery_ids_are_deduped_too(client: Any, redis: Redis) -> None:
    for _ in range(3):
        post(client, labeled(), delivery="not/a job:id ✓".encode().decode("ascii", "ignore"))
    assert queued(redis) == 1


def test_events_from_the_app_itself_enqueue_nothing(client: Any, redis: Redis) -> None:
    resp = post(client, labeled(sender_type="Bot", login="loopbot-test[bot]"))
    assert resp.status_code == 202 and resp.json["status"] == "ignored"
    assert queued(redis) == 0


def test_healthz_follows_redis(settings: Settings, redis: Redis) -> None:
    assert create_app(settings, redis).test_client().get("/healthz").status_code == 200
    dead = Redis(port=1, socket_connect_timeout=0.2)
    assert create_app(settings, dead).test_client().get("/healthz").status_code == 503


def test_redis_down_during_webhook_is_503(settings: Settings) -> None:
    dead = Redis(port=1, socket_connect_timeout=0.2)
    resp = post(create_app(settings, dead).test_client(), labeled())
    assert resp.status_code == 503


header_values = st.one_of(
    st.none(), st.text(max_size=40), st.sampled_from(["issues", "ping", "issue_comment"])
)


@hsettings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    body=st.one_of(
        st.binary(max_size=300),
        st.builds(
            lambda p: json.dumps(p).encode(),
            st.recursive(
                st.none() | st.booleans() | st.integers() | st.text(max_size=10),
                lambda c: (
                    st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c, max_size=4)
                ),
                max_leaves=10,
            ),
        ),
    ),
    event=header_values,
    delivery=header_values,
    sig=st.one_of(st.none(), st.text(max_size=80), st.just("sha256=" + "0" * 64)),
)
def test_random_input_never_5xx_and_never_enqueues(
    client: Any, redis: Redis, body: bytes, event: str | None, delivery: str | None, sig: str | None
) -> None:
    headers = {
        k: v
        for k, v in {
            "X-GitHub-Event": event,
            "X-GitHub-Delivery": delivery,
            "X-Hub-Signature-256": sig,
        }.items()
        if v is not None and v.isascii() and "\n" not in v and "\r" not in v
    }
    resp = client.post("/webhook", data=body, headers=headers)
    assert resp.status_code < 500
    assert resp.status_code == 401  # unsigned or wrongly signed: rejected before anything else
    assert queued(redis) == 0


_FIELDS = ["action", "issue", "label", "sender", "installation", "repository", "comment"]
_SUBKEYS = ["number", "name", "login", "id", "type", "full_name", "body"]
_leaf = st.one_of(st.integers(), st.text(max_size=5))
_value = st.one_of(st.none(), _leaf, st.dictionaries(st.sampled_from(_SUBKEYS), _leaf, max_size=3))
_EVENTS = ["issues", "issue_comment", "pull_request_review", "check_suite", "check_run"]


@hsettings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    payload=st.dictionaries(st.sampled_from(_FIELDS), _value, max_size=7),
    event=st.sampled_from(_EVENTS),
)
def test_signed_garbage_payloads_never_5xx(
    client: Any, redis: Redis, payload: dict[str, Any], event: str
) -> None:
    body = json.dumps(payload).encode()
    forget_delivery(redis, "g", body)  # each example is a first delivery, routed afresh
    resp = post(client, None, raw=body, event=event, delivery="g")
    assert resp.status_code in (200, 202, 400)
    assert resp.json.get("status") != "duplicate", resp.json
    if resp.json.get("status") == "queued":  # and it left today's two dedupe records
        assert redis.exists(Job.key_for(command_job_id("g")))
        assert redis.get(body_key(hashlib.sha256(body).hexdigest())) == b"cmd-g"


def forget_delivery(redis: Redis, delivery: str, body: bytes) -> None:
    """Delete the two records that make a delivery a duplicate (bot/io/queues.py,
    ``CommandEnqueuer``): the command job named after the delivery id, and the body's
    hash, which names the delivery that first carried that body."""
    redis.delete(Job.key_for(command_job_id(delivery)), body_key(hashlib.sha256(body).hexdigest()))


def test_forgetting_a_delivery_lets_it_through_again(client: Any, redis: Redis) -> None:
    body = json.dumps(labeled()).encode()
    assert post(client, None, raw=body, delivery="g").json["status"] == "queued"
    assert post(client, None, raw=body, delivery="g").json["status"] == "duplicate"
    assert post(client, None, raw=body, delivery="h").json == {
        "status": "duplicate",
        "reason": "this body was delivered before",
    }
    forget_delivery(redis, "g", body)
    assert post(client, None, raw=body, delivery="g").json["status"] == "queued"


def test_one_round_trip_enqueue_writes_the_job_rq_would(redis: Redis) -> None:
    """The webhook's enqueue script writes the same job hash as RQ's own enqueue, and RQ
    reads it back as the job it is: a change in RQ's format fails here, not in production."""
    import zlib

    from rq.job import JobStatus

    from bot.core.commands import LabelAdded
    from bot.io.queues import (
        CommandEnqueuer,
        Duplicate,
        Replay,
        control_queue,
        fetch_job,
        rq_job_fields,
    )

    queue = control_queue(redis)
    cmd = LabelAdded(
        installation_id=5,
        repo="acme/widgets",
        issue=3,
        actor='al"ice\\',
        delivery="d-rt",
        label="loop:ready",
    )
    job_id = CommandEnqueuer(queue).enqueue(cmd, "ab" * 32)
    stored = redis.hgetall(f"rq:job:{job_id}")
    written = {k.decode() if isinstance(k, bytes) else k: v for k, v in stored.items()}
    reference = rq_job_fields(queue, cmd)
    stamps = {"created_at", "enqueued_at"}
    # The data is compressed with a smaller window than RQ's: what RQ reads back is equal.
    assert zlib.decompress(written.pop("data")) == zlib.decompress(reference.pop("data"))
    assert {k: v for k, v in written.items() if k not in stamps} == {
        k: v for k, v in reference.items() if k not in stamps
    }
    assert written.keys() == reference.keys()
    job = fetch_job(job_id, redis)
    assert job.get_status() == JobStatus.QUEUED
    assert (job.func_name, tuple(job.args), job.timeout, job.retries_left) == (
        "jobs.dispatch.handle_command",
        (cmd.model_dump_json(),),
        300,
        3,
    )
    assert job.refusal() is None
    assert redis.lrange("rq:queue:loopbot-control", 0, -1) == [job_id.encode()]
    assert b"rq:queue:loopbot-control" in redis.smembers("rq:queues")
    # The same delivery again, and the same body under a new delivery: nothing written.
    with pytest.raises(Duplicate):
        CommandEnqueuer(queue).enqueue(cmd, "ab" * 32)
    with pytest.raises(Replay):
        CommandEnqueuer(queue).enqueue(cmd.model_copy(update={"delivery": "d-2"}), "ab" * 32)
    assert redis.llen("rq:queue:loopbot-control") == 1
    assert not redis.exists("rq:job:cmd-d-2")
