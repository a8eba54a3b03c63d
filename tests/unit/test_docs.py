"""The manual cannot name what does not exist (tests/docs_check.py says how it reads the
pages), and docs/loop-yml.md is what bot/ops/loop_yml_docs.py writes from the config
model now. Each kind of check is also shown failing: on a page made up to break it, and
on the real pages with the thing they name taken away."""

from __future__ import annotations

import re
from dataclasses import replace

import click
import pytest

from bot.core import repo_config
from bot.ops import loop_yml_docs
from tests import docs_check
from tests.docs_check import ROOT, check, current, docs, slug_of

PAGES = {p: p.read_text() for p in docs()}


def _whats(problems: list[docs_check.Problem]) -> list[str]:
    return [p.what for p in problems]


def test_the_manual_names_only_what_exists() -> None:
    problems = check(PAGES)
    assert problems == [], "\n".join(map(str, problems))


def test_the_manual_is_what_the_readme_links_and_checks() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in PAGES}
    assert {
        "README.md",
        "CHANGELOG.md",
        "docs/operating.md",
        "docs/repositories.md",
        "docs/loop-yml.md",
        "docs/security.md",
        "docs/architecture.md",
        "docs/benchmarks.md",
        "docs/troubleshooting.md",
        "docs/testing.md",
    } <= names
    readme = PAGES[ROOT / "README.md"]
    assert len(readme.split("\n")) < 250
    for page in names - {"README.md"}:
        assert f"]({page})" in readme, f"the README does not link {page}"


def test_the_loop_yml_reference_is_what_the_script_writes_now() -> None:
    assert loop_yml_docs.DOC.read_text() == loop_yml_docs.render(), (
        f"docs/loop-yml.md is out of date: run {loop_yml_docs.COMMAND}"
    )


def test_the_reference_holds_every_key_with_its_default_and_limits() -> None:
    text = loop_yml_docs.render()
    for key in loop_yml_docs.all_keys():
        assert f"| `{key}` |" in text or f"\n## `{key}`\n" in text, key  # a row or a section
    # Read from the fields, not written by hand: a default, a limit and a ceiling.
    assert "| `max_turns` | integer | `20` | ≥ 1, ≤ 100 | `LOOPBOT_MAX_TURNS` |" in text
    assert "| `spend.day_usd` | number | none | > 0 | `LOOPBOT_SPEND_REPO_DAY_USD` |" in text
    assert '| `merge.protected_paths` | list of string | `[".github/**"]` |' in text


BAD = """# A page that names what does not exist

Run `loopbot frobnicate` and then `loopbot report --weekly`; `loopbot doctor --github` is fine.

```sh
loopbot worker --loops 2 --turbo   # one real option, one not
```

Set `LOOPBOT_NO_SUCH_SETTING=1`, keep `LOOPBOT_MAX_TURNS`, and `LOOPBOT_NOPE_*` names none.
In loop.yml, `spend.weekly_usd: 5` is not a key; `spend.day_usd: 5` is, and so is `critic.enabled`.
Shown by `tests/io/test_nothing.py` and `tests/unit/test_docs.py::test_no_such_test`, not
by `tests/unit/test_docs.py::test_each_kind_of_mistake_is_reported`, which exists.

See [a page](no-such-page.md), [a heading](operating.md#no-such-heading),
[this page's own](#nowhere), [one that works](operating.md#spend-caps) and
[GitHub](https://github.com/no/where.md).

## A heading
"""


def test_each_kind_of_mistake_is_reported() -> None:
    page = ROOT / "docs" / "bad.md"  # not on disk: its links resolve from docs/
    found = _whats(check({page: BAD}))
    assert found == [
        "unknown command: loopbot frobnicate",
        "unknown option of loopbot report: --weekly",
        "unknown option of loopbot worker: --turbo",
        "unknown loop.yml key: spend.weekly_usd",
        "no such file: tests/io/test_nothing.py",
        "no such test: tests/unit/test_docs.py::test_no_such_test",
        "unknown setting LOOPBOT_NO_SUCH_SETTING",
        "unknown setting LOOPBOT_NOPE_*",
        "broken link: no-such-page.md (docs/no-such-page.md does not exist)",
        "broken anchor: operating.md#no-such-heading (no such heading in operating.md)",
        "broken anchor: #nowhere (no such heading in bad.md)",
    ]
    assert check({page: BAD.replace("#nowhere", "#a-heading")})[-1].what.startswith(
        "broken anchor: operating.md#no-such-heading"
    )


def _without_command(name: str) -> click.Group:
    return click.Group(
        "loopbot", commands={n: c for n, c in docs_check.cli.commands.items() if n != name}
    )


def test_removing_a_command_the_docs_name_fails_them() -> None:
    names = replace(current(), cli=_without_command("report"))
    found = check(PAGES, names)
    assert found and set(_whats(found)) == {"unknown command: loopbot report"}
    assert {p.doc for p in found} >= {"docs/operating.md", "CHANGELOG.md"}


def test_removing_a_setting_the_docs_name_fails_them() -> None:
    names = replace(current(), settings=current().settings - {"LOOPBOT_SPEND_REPO_DAY_USD"})
    found = check(PAGES, names)
    assert found and set(_whats(found)) == {"unknown setting LOOPBOT_SPEND_REPO_DAY_USD"}
    assert "docs/operating.md" in {p.doc for p in found}


def test_removing_a_loop_yml_key_the_docs_name_fails_them() -> None:
    names = replace(current(), keys=current().keys - {"spend.day_usd"})
    found = check(PAGES, names)
    assert found and set(_whats(found)) == {"unknown loop.yml key: spend.day_usd"}
    assert {"docs/operating.md", "docs/loop-yml.md"} <= {p.doc for p in found}


def test_renaming_a_heading_breaks_the_links_to_it() -> None:
    operating = ROOT / "docs" / "operating.md"
    renamed = PAGES[operating].replace("## Spend caps\n", "## Caps\n")
    found = check({**PAGES, operating: renamed})
    # The page's own links to it, and another page's.
    assert {(p.doc, p.what) for p in found} == {
        ("docs/operating.md", "broken anchor: #spend-caps (no such heading in operating.md)"),
        (
            "docs/troubleshooting.md",
            "broken anchor: operating.md#spend-caps (no such heading in operating.md)",
        ),
    }


def test_a_missing_screenshot_is_a_broken_link() -> None:
    found = check({ROOT / "README.md": "![the status](docs/screenshots/no-such.png)\n"})
    assert _whats(found) == [
        "broken link: docs/screenshots/no-such.png (docs/screenshots/no-such.png does not exist)"
    ]


@pytest.mark.parametrize(
    ("heading", "slug"),
    [
        ("Spend caps", "spend-caps"),  # lower case, spaces become hyphens
        ("Redis: persistence", "redis-persistence"),  # punctuation goes
        ("`.github/loop.yml`", "githubloopyml"),  # code keeps its words, not its dots
        ("Before the first loop: doctor --github", "before-the-first-loop-doctor---github"),
        ("GitHub's limits, across workers", "githubs-limits-across-workers"),
        ("No loop is left in `reviewing` or `merging`", "no-loop-is-left-in-reviewing-or-merging"),
        ("[Linked](x.md) words", "linked-words"),  # a link's words, not its target
        ("snake_case stays", "snake_case-stays"),  # underscores are kept
    ],
)
def test_github_slugs(heading: str, slug: str) -> None:
    assert slug_of(heading) == slug


def test_a_repeated_heading_gets_a_number() -> None:
    assert docs_check.anchors("# A\n## Notes\n## Notes\n```\n# not a heading\n```\n") == {
        "a",
        "notes",
        "notes-1",
    }


DOC_REF = re.compile(r"docs/[a-z0-9-]+\.md(?:#[a-z0-9_-]+)?")


def test_the_pages_operator_messages_name_exist() -> None:
    # doctor's fixes and the comments loopbot posts point at these pages by path.
    refs = [
        (path, m.group(0))
        for base in ("bot", "jobs")
        for path in sorted((ROOT / base).rglob("*.py"))
        for m in DOC_REF.finditer(path.read_text())
    ]
    assert any(ref.startswith("docs/operating.md#") for _, ref in refs)
    broken = [(p, r) for p, r in refs if docs_check.broken(ROOT / "README.md", r)]
    assert broken == []


def test_settings_read_outside_the_model_count_as_settings() -> None:
    names = current().settings
    # The env file's own variable (bot/core/settings.py) and a CLI option's
    # (`loopbot worker --loops`) are read by name, not through the settings model.
    assert {"LOOPBOT_ENV_FILE", "LOOPBOT_WORKER_LOOPS", "REDIS_URL"} <= names


def test_the_tests_still_read_the_settings_the_docs_say_they_read() -> None:
    for name in docs_check.TEST_SETTINGS:
        readers = [p for p in (ROOT / "tests").rglob("test_*.py") if name in p.read_text()]
        assert readers, f"no test reads {name} any more"


YAML_BLOCK = re.compile(r"```yaml\n(.*?)```", re.S)


def test_the_loop_yml_examples_are_valid() -> None:
    examples = [
        block
        for text in PAGES.values()
        for block in YAML_BLOCK.findall(text)
        if re.search(r"^verify:", block, re.M)  # a whole loop.yml, not a fragment
    ]
    assert examples
    for block in examples:
        repo_config.parse(block)  # raises ConfigError naming the keys
