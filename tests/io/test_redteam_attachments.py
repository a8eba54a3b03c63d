"""Red team on attachments (issue 39): hostile files and links in an issue's ``body_html``
are skipped with a reason, never an exception that ends the loop's job, and a link is
fetched only under GitHub's attachment paths (no ``..`` out of them)."""

from __future__ import annotations

import pytest

from bot.core.attachments import allowed, links

API = "https://api.github.com"


@pytest.mark.parametrize(
    "href",
    [
        "https://github.com:99999/user-attachments/assets/x",  # port out of range
        "https://github.com:abc/user-attachments/assets/x",  # port not a number
        "https://private-user-images.githubusercontent.com:1x/a.png",
        "http://[x/user-attachments/assets/x",  # a bracket left open
        "https://a\uff03b@github.com/user-attachments/assets/x",  # NFKC makes it a '#'
    ],
)
def test_a_malformed_link_is_not_an_attachment_and_not_an_error(href: str) -> None:
    found, _ = links(f'<p><a href="{href}">x</a> <img src="{href}" alt="y"></p>', API)
    assert found == []


@pytest.mark.parametrize(
    "url",
    [
        "https://github.com/user-attachments/../login",
        "https://github.com/user-attachments/assets/../../settings/tokens",
        "https://github.com/user-attachments/%2e%2e/login",
        "https://github.com/user-attachments/%2E%2E/%2E%2E/login",
        "http://127.0.0.1:8080/user-attachments/../repos/acme/widgets/issues/1",
        "http://127.0.0.1:8080/private-user-images/..%2f..%2frepos/acme/widgets",
    ],
)
def test_a_link_that_climbs_out_of_the_attachment_paths_is_not_fetched(url: str) -> None:
    api = "http://127.0.0.1:8080" if url.startswith("http://") else API
    assert not allowed(url, api)
