"""loopbot's GitHub client: githubkit with App auth, timeouts, retries, idempotent writes.

``GitHubApp`` holds the App identity and mints installation tokens (cached until five
minutes before they expire, minted again on a 401): bot/io/github/app.py. ``Installation``
is the interface jobs use; it returns small models with only the fields loopbot reads, and
every call goes through ``_call`` which applies ``bot.io.github.failures.classify``.
It is one object made of parts, one module each: its plumbing (bot/io/github/plumbing.py:
the token, the clients, the redaction and the way every call is made), repositories
(repos.py), issues and comments (issues.py), pull requests, reviews and the merge
(pulls.py), checks (checks.py), and what a base branch asks before a merge (rules.py).

Writes a retry could repeat (comments, reviews, pull requests, check runs) look for
what an earlier attempt may have written before writing again: a hidden marker in the
body, the branch of a pull request, the name and head of a check run.

Every text loopbot writes goes through ``Installation._text`` (or ``_title``): the
secrets the worker holds and the installation's token of the moment are redacted
(``bot.core.text.redact``, the same redaction as the session log), then the text is
defused (``bot.core.text.defuse``). No caller can forget either.
"""

from __future__ import annotations

from bot.io.github.app import AppIdentity
from bot.io.github.checks import Checks
from bot.io.github.issues import Issues
from bot.io.github.pulls import Pulls
from bot.io.github.queue import MergeQueues
from bot.io.github.rules import Rules


class GitHubApp(AppIdentity):
    """The App (bot/io/github/app.py) and what it opens: an ``Installation``. Only this
    is here: the installation's parts import the App's module, so it cannot import them."""

    def installation(self, installation_id: int) -> Installation:
        return Installation(self, installation_id)


class Installation(Rules, MergeQueues, Issues, Pulls, Checks):
    """GitHub as one installation of the App sees it; what the jobs talk to."""

    # Opened by ``GitHubApp.installation`` alone, so its App is a GitHubApp (callers open
    # other installations with it); the parts need only the identity.
    app: GitHubApp
