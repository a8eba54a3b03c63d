"""The pace rule (bot/core/rules/pace.py): who starts now, who waits, and where they stand;
with the loop.yml key, the operator's setting and the words on the issue."""

from __future__ import annotations

import pytest

from bot.core import repo_config
from bot.core.record import LoopRecord, Status, Waiting
from bot.core.rules import pace
from bot.core.rules.pace import PLACES_SHOWN, Place, Scope, Waiter, decide
from bot.core.settings import SettingsError, load_settings
from bot.core.text import messages

KEY = "-----BEGIN RSA PRIVATE KEY-----\nabc\n-----END RSA PRIVATE KEY-----\n"


def w(key: str, since: float, priority: bool = False) -> Waiter:
    return Waiter(key, key.partition("#")[0], priority, since)


def slots(*keys: str) -> dict[str, str]:
    return {k: k.partition("#")[0] for k in keys}


# (name, running loops, line, repository caps, operator cap, admitted in order,
#  places of those left: key -> (place, running, cap, scope))
CASES = [
    ("an empty line admits nobody", slots("a/x#1"), [], {"a/x": 2}, 20, [], {}),
    (
        "a full repository holds its line back",
        slots("a/x#1", "a/x#2"),
        [w("a/x#3", 1), w("a/x#4", 2)],
        {"a/x": 2},
        20,
        [],
        {"a/x#3": (1, 2, 2, Scope.REPOSITORY), "a/x#4": (2, 2, 2, Scope.REPOSITORY)},
    ),
    (
        "a free slot goes to the oldest",
        slots("a/x#1"),
        [w("a/x#4", 2), w("a/x#3", 1)],
        {"a/x": 2},
        20,
        ["a/x#3"],
        {"a/x#4": (1, 2, 2, Scope.REPOSITORY)},
    ),
    (
        "the priority label goes before age",
        slots("a/x#1"),
        [w("a/x#3", 1), w("a/x#4", 2), w("a/x#5", 3, priority=True)],
        {"a/x": 2},
        20,
        ["a/x#5"],
        {"a/x#3": (1, 2, 2, Scope.REPOSITORY), "a/x#4": (2, 2, 2, Scope.REPOSITORY)},
    ),
    (
        "among priority loops the oldest goes first",
        {},
        [w("a/x#7", 9, True), w("a/x#6", 8, True), w("a/x#1", 1)],
        {"a/x": 1},
        20,
        ["a/x#6"],
        {"a/x#7": (1, 1, 1, Scope.REPOSITORY), "a/x#1": (2, 1, 1, Scope.REPOSITORY)},
    ),
    (
        "a full repository does not hold another one back",
        slots("a/x#1", "a/x#2"),
        [w("a/x#3", 1), w("b/y#1", 2)],
        {"a/x": 2, "b/y": 2},
        20,
        ["b/y#1"],
        {"a/x#3": (1, 2, 2, Scope.REPOSITORY)},
    ),
    (
        "the operator's cap holds every repository back",
        slots("a/x#1", "b/y#1", "c/z#1"),
        [w("a/x#2", 1), w("b/y#2", 2), w("b/y#3", 3)],
        {"a/x": 3, "b/y": 3},
        3,
        [],
        {
            "a/x#2": (1, 3, 3, Scope.OPERATOR),
            "b/y#2": (1, 3, 3, Scope.OPERATOR),
            "b/y#3": (2, 3, 3, Scope.OPERATOR),
        },
    ),
    (
        "under the operator's cap the order holds across repositories",
        slots("a/x#1", "b/y#1", "c/z#1"),
        [w("b/y#2", 2), w("c/z#2", 1)],
        {},
        4,
        ["c/z#2"],
        {"b/y#2": (1, 4, 4, Scope.OPERATOR)},
    ),
    (
        "a repository's cap above the operator's counts as the operator's",
        {},
        [w("a/x#1", 1), w("a/x#2", 2), w("a/x#3", 3)],
        {"a/x": 50},
        2,
        ["a/x#1", "a/x#2"],
        {"a/x#3": (1, 2, 2, Scope.REPOSITORY)},
    ),
    (
        "a repository never seen gets the default cap",
        {},
        [w("a/x#1", 1), w("a/x#2", 2), w("a/x#3", 3), w("a/x#4", 4)],
        {},
        20,
        ["a/x#1", "a/x#2", "a/x#3"],
        {"a/x#4": (1, 3, 3, Scope.REPOSITORY)},
    ),
    (
        "a raised cap admits several at once",
        slots("a/x#1"),
        [w("a/x#2", 1), w("a/x#3", 2)],
        {"a/x": 5},
        20,
        ["a/x#2", "a/x#3"],
        {},
    ),
    (
        "loops over the cap (counted, not stopped) admit nobody",
        slots("a/x#1", "a/x#2", "a/x#3"),
        [w("a/x#4", 1)],
        {"a/x": 1},
        20,
        [],
        {"a/x#4": (1, 3, 1, Scope.REPOSITORY)},
    ),
]


@pytest.mark.parametrize(
    ("running", "line", "caps", "operator", "admit", "places"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_decide(
    running: dict[str, str],
    line: list[Waiter],
    caps: dict[str, int],
    operator: int,
    admit: list[str],
    places: dict[str, tuple[int, int, int, Scope]],
) -> None:
    decision = decide(running, line, caps, operator)
    assert [x.key for x in decision.admit] == admit
    got = {k: (p.place, p.running, p.cap, p.scope) for k, p in decision.places.items()}
    assert got == places


def test_two_repositories_never_pass_their_own_caps_together() -> None:
    # Many waiters, two repositories, an operator cap between their sum and either.
    line = [w(f"a/x#{i}", i) for i in range(1, 8)] + [w(f"b/y#{i}", i + 0.5) for i in range(1, 8)]
    decision = decide({}, line, {"a/x": 2, "b/y": 3}, 4)
    admitted = [x.key for x in decision.admit]
    assert admitted == ["a/x#1", "b/y#1", "a/x#2", "b/y#2"]  # by age, a/x full at 2


def test_places_past_the_shown_ones_say_more_than() -> None:
    far = pace.shown(Place(PLACES_SHOWN + 7, 2, 2, Scope.REPOSITORY))
    near = pace.shown(Place(2, 2, 2, Scope.REPOSITORY))
    assert far.place == PLACES_SHOWN + 1 and near.place == 2
    # Moving from 17th to 16th changes nothing shown: no comment edit for it.
    assert pace.same(far, pace.shown(Place(PLACES_SHOWN + 6, 2, 2, Scope.REPOSITORY)))
    assert not pace.same(near, pace.shown(Place(1, 2, 2, Scope.REPOSITORY)))
    assert pace.phase(far) == f"waiting (place {PLACES_SHOWN + 1}+)"
    assert pace.phase(near) == "waiting (place 2)"
    assert pace.same(near.model_copy(update={"posted": True}), near)  # posted aside


def test_waiting_and_admitted_changes() -> None:
    changes = pace.waiting(Place(3, 2, 2, Scope.REPOSITORY, True))
    assert changes["phase"] == "waiting (place 3)"
    assert changes["waiting"] == Waiting(
        place=3, running=2, cap=2, scope="repository", priority=True
    )
    assert pace.admitted() == {"waiting": None, "phase": "queued"}


# -- what the issue says ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "word"),
    [
        (1, "1st"),
        (2, "2nd"),
        (3, "3rd"),
        (4, "4th"),
        (11, "11th"),
        (12, "12th"),
        (13, "13th"),
        (21, "21st"),
        (22, "22nd"),
        (101, "101st"),
        (111, "111th"),
    ],
)
def test_ordinal(n: int, word: str) -> None:
    assert messages.ordinal(n) == word


def test_waiting_line_names_the_place_and_the_cap() -> None:
    repo = Waiting(place=2, running=2, cap=2, scope="repository")
    assert messages.waiting_line(repo) == (
        "⏳ Waiting to start: 2nd in line; 2 loops of this repository are running "
        "(`max_parallel` 2). It starts when one of them ends."
    )
    op = Waiting(place=1, running=1, cap=1, scope="operator", priority=True)
    line = messages.waiting_line(op)
    assert "1st in line; 1 loop is running across all repositories" in line
    assert "`LOOPBOT_MAX_PARALLEL` 1" in line and "Priority label" in line
    far = Waiting(place=PLACES_SHOWN + 1, running=3, cap=3, scope="repository")
    assert f"more than {PLACES_SHOWN} loops are ahead of it in line" in messages.waiting_line(far)


def test_status_comment_shows_the_place_only_while_waiting() -> None:
    record = LoopRecord(repo="a/x", issue=3, installation_id=1)
    record.waiting = Waiting(place=2, running=2, cap=2, scope="repository")
    body = messages.status_comment(record)
    assert "2nd in line" in body and "`max_parallel` 2" in body
    assert "2nd in line" in messages.status_reply(record)
    started = LoopRecord.model_validate(record.model_dump() | {"status": Status.RUNNING})
    assert "in line" not in messages.status_comment(started)


# -- the keys ---------------------------------------------------------------------------------


def test_loop_yml_max_parallel_and_priority_label() -> None:
    config = repo_config.parse("verify: 'true'\n")
    assert config.max_parallel == 3 and config.labels.priority == "loop:priority-high"
    config = repo_config.parse("verify: 'true'\nmax_parallel: 1\nlabels:\n  priority: urgent\n")
    assert config.max_parallel == 1 and config.labels.priority == "urgent"
    with pytest.raises(repo_config.ConfigError) as exc:
        repo_config.parse("verify: 'true'\nmax_parallel: 0\n")
    assert "`max_parallel`" in str(exc.value)
    with pytest.raises(repo_config.ConfigError) as exc:
        repo_config.parse("verify: 'true'\nmax_paralel: 2\n")
    assert "`max_paralel`: unknown key" in str(exc.value)


def test_max_parallel_above_the_operator_is_lowered_and_said() -> None:
    ceilings = repo_config.Ceilings(max_parallel=4)
    config, notes = repo_config.load("verify: 'true'\nmax_parallel: 9\n", ceilings)
    assert config.max_parallel == 4
    assert notes == [
        "`max_parallel`: 9 asked, lowered to 4 (the operator's ceiling, `LOOPBOT_MAX_PARALLEL`)"
    ]
    assert repo_config.load("verify: 'true'\nmax_parallel: 4\n", ceilings)[1] == []


def test_operator_setting() -> None:
    env = {"GITHUB_APP_ID": "12", "GITHUB_PRIVATE_KEY": KEY, "GITHUB_WEBHOOK_SECRET": "s"}
    settings = load_settings(env, role="web")
    assert settings.max_parallel == pace.DEFAULT_OPERATOR_MAX == 20
    assert repo_config.Ceilings.of(settings).max_parallel == 20
    assert load_settings(env | {"LOOPBOT_MAX_PARALLEL": "5"}).max_parallel == 5
    # loopbot doctor reports settings through load_settings: a bad value is named.
    with pytest.raises(SettingsError) as exc:
        load_settings(env | {"LOOPBOT_MAX_PARALLEL": "0"})
    assert "LOOPBOT_MAX_PARALLEL" in str(exc.value)
