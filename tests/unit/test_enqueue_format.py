"""The webhook's enqueue writes RQ's job format by hand (bot/io/queues.py): the pieces it
builds without RQ are what RQ reads back byte for byte, for any command text (the job's
data is compressed with a smaller window than RQ's; RQ's ``zlib.decompress`` reads both)."""

from __future__ import annotations

import zlib
from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st
from redis import Redis
from rq.job import Job
from rq.serializers import JSONSerializer
from rq.utils import utcformat

from bot.core.commands import IssueEdited, LabelAdded
from bot.io.queues import COMMAND_ENTRY, _job_data, _stamp

# Any text, quotes, backslashes, control characters and non-ASCII included: each one is
# escaped twice (the command's JSON, inside the call's JSON).
TEXT = st.text(st.characters(codec="utf-8"), max_size=40)


def rq_data(command: LabelAdded | IssueEdited) -> bytes:
    # RQ's own job for the same call; a client that never connects (Job.create does no I/O).
    job = Job.create(
        COMMAND_ENTRY,
        args=(command.model_dump_json(),),
        connection=Redis(),
        serializer=JSONSerializer,
    )
    return job.data


@given(actor=TEXT, label=TEXT, delivery=TEXT)
def test_job_data_is_what_rq_writes(actor: str, label: str, delivery: str) -> None:
    command = LabelAdded(
        installation_id=5,
        repo="acme/widgets",
        issue=3,
        actor=actor,
        delivery=delivery,
        label=label,
    )
    assert zlib.decompress(_job_data(command)) == rq_data(command)


@given(title=TEXT, body=st.text(max_size=3000))
def test_job_data_is_what_rq_writes_for_long_text(title: str, body: str) -> None:
    command = IssueEdited(installation_id=5, repo="a/b", issue=1, actor="x", title=title, body=body)
    assert zlib.decompress(_job_data(command)) == rq_data(command)


# From year 1000: strftime writes year 999 unpadded, isoformat as 0999; no job is that old.
@given(st.datetimes(min_value=datetime(1000, 1, 1), timezones=st.just(UTC)))
def test_stamp_is_rqs_utcformat(moment: datetime) -> None:
    # Whole seconds too: isoformat would drop ".000000" without timespec.
    assert _stamp(moment) == utcformat(moment)


def test_stamp_defaults_to_now() -> None:
    before = datetime.now(UTC).replace(tzinfo=None)
    stamp = datetime.strptime(_stamp(), "%Y-%m-%dT%H:%M:%S.%fZ")
    assert before <= stamp <= datetime.now(UTC).replace(tzinfo=None)
