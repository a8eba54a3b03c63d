"""A local Python package index (PEP 503 "simple" pages and wheels), for the tests and
the setup benchmark: what `setup` installs from over its allowed network.

Each package is a real wheel built here (``wheel``), served with the headers PyPI sends
(``Cache-Control`` on files), so pip's own HTTP cache behaves as it does against PyPI.
``delay`` seconds per file download stand for a real network; every request is counted
(``files``, ``pages``) so a test can tell a cache hit from a download.
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import io
import time
import zipfile
from collections import Counter

from bot.standins import serving


def wheel(name: str, version: str = "1.0", payload: int = 0) -> tuple[str, bytes]:
    """A minimal valid wheel of package ``name`` (module ``name`` with ``VALUE = 42``),
    padded with ``payload`` bytes of data; returns (file name, bytes)."""
    module = name.replace("-", "_")
    dist = f"{module}-{version}"
    files = {
        f"{module}/__init__.py": b"VALUE = 42\n",
        f"{module}/data.bin": hashlib.shake_256(name.encode()).digest(payload) if payload else b"",
        f"{dist}.dist-info/METADATA": (
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        ).encode(),
        f"{dist}.dist-info/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: loopbot-tests\nRoot-Is-Purelib: true\n"
            b"Tag: py3-none-any\n"
        ),
    }
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{dist}.dist-info/RECORD,,")
    files[f"{dist}.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for path, data in files.items():
            z.writestr(path, data)
    return f"{dist}-py3-none-any.whl", buf.getvalue()


class PackageIndex:
    """``http://host:port/simple/`` with the given packages."""

    def __init__(
        self,
        names: list[str],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        delay: float = 0.0,
        payload: int = 0,
    ) -> None:
        self.wheels = {n: wheel(n, payload=payload) for n in names}
        self.delay = delay
        self.files: Counter[str] = Counter()
        self.pages: Counter[str] = Counter()
        index = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                index._get(self)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer((host, port), Handler)
        self.host, self.port = host, self.httpd.server_address[1]

    @property
    def url(self) -> str:
        port = "" if self.port == 80 else f":{self.port}"
        return f"http://{self.host}{port}/simple/"

    def start(self) -> PackageIndex:
        serving.run_in_thread(self.httpd, "package-index")
        return self

    def stop(self) -> None:
        serving.stop(self.httpd)

    def _get(self, h: http.server.BaseHTTPRequestHandler) -> None:
        parts = [p for p in h.path.split("?")[0].split("/") if p]
        if len(parts) == 2 and parts[0] == "simple" and parts[1] in self.wheels:
            self.pages[parts[1]] += 1
            file, data = self.wheels[parts[1]]
            digest = hashlib.sha256(data).hexdigest()
            body = (
                f'<!DOCTYPE html><html><body><a href="/files/{file}#sha256={digest}">'
                f"{file}</a></body></html>"
            ).encode()
            self._send(h, 200, body, "text/html", "max-age=600")
            return
        if len(parts) == 2 and parts[0] == "files":
            for name, (file, data) in self.wheels.items():
                if file == parts[1]:
                    self.files[name] += 1
                    time.sleep(self.delay)
                    # As PyPI serves files: immutable, cached for a year.
                    self._send(
                        h,
                        200,
                        data,
                        "application/octet-stream",
                        "max-age=365000000, immutable, public",
                    )
                    return
        self._send(h, 404, b"not found", "text/plain", "no-cache")

    @staticmethod
    def _send(
        h: http.server.BaseHTTPRequestHandler, code: int, body: bytes, kind: str, cache: str
    ) -> None:
        h.send_response(code)
        h.send_header("Content-Type", kind)
        h.send_header("Content-Length", str(len(body)))
        h.send_header("Cache-Control", cache)
        h.end_headers()
        h.wfile.write(body)
