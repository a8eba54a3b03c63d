"""A local server that speaks enough of GitHub's REST API for loopbot, over HTTP.

Backed by real bare git repositories: ``clone_url`` is served by ``git http-backend``
(token auth through HTTP Basic, like github.com), pull requests read their heads from
the real refs, and a squash merge writes a real commit onto the default branch.

State changes made by users (a label added, a comment, an issue closed) are sent as
signed webhooks to ``webhook_url``, in order, from one sender thread. Faults can be
injected per route: a status (5xx, 403 with ``Retry-After``), a delay, and "after"
faults that apply the write and then fail, which is what makes idempotency testable.

Used by the tests and by ``loopbot demo``. Not a security boundary.

Layout: ``state`` (the in-memory world), ``server`` (``GitHubServer``: the app, its
threads, the test's hands), one module per resource that registers its routes (``auth``,
``repos``, ``issues``, ``pulls``, ``checks``, ``git_http``), ``webhooks`` (the sender),
``shapes`` (GitHub's JSON) and ``wire`` (errors, pagination, route tables).
"""

from bot.standins.github.server import GitHubServer
from bot.standins.github.state import Fault, Issue, Pull, Repo, User
from bot.standins.github.wire import Json

__all__ = ["Fault", "GitHubServer", "Issue", "Json", "Pull", "Repo", "User"]
