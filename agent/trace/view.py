"""`xhagent trace view`: speedscope (a static web app from npm) and one profile served
on loopback, so a trace is read in a browser with no network and nothing uploaded."""

from __future__ import annotations

import functools
import http.server
import io
import os
import threading
import urllib.parse
from pathlib import Path

# where tools/setup-viewer installs it in a source checkout
CHECKOUT_SPEEDSCOPE = (
    Path(__file__).resolve().parents[2] / ".cache/speedscope/node_modules/speedscope/dist/release"
)
ENV_SPEEDSCOPE = "XHAGENT_SPEEDSCOPE"
PROFILE_PREFIX = "/profile/"


class ViewError(Exception):
    pass


def find_speedscope(given: str | None = None) -> Path:
    """speedscope's dist/release directory: given, else $XHAGENT_SPEEDSCOPE, else the
    checkout's .cache (tools/setup-viewer)."""
    candidates = [given] if given else [os.environ.get(ENV_SPEEDSCOPE), CHECKOUT_SPEEDSCOPE]
    for cand in candidates:
        if cand and (Path(cand) / "index.html").is_file():
            return Path(cand)
    where = given or f"${ENV_SPEEDSCOPE} or {CHECKOUT_SPEEDSCOPE}"
    raise ViewError(
        f"speedscope not found ({where} has no index.html): run tools/setup-viewer, or "
        "`npm install speedscope` and pass --speedscope .../node_modules/speedscope/dist/release"
    )


def chrome_json(path: str, allow_truncated: bool = False) -> bytes:
    """The Chrome trace JSON of an xhagent trace file, as `trace export --format chrome`."""
    from .export import write_chrome
    from .fmt import TraceFile

    out = io.StringIO()
    write_chrome(TraceFile(path, allow_truncated=allow_truncated), out)
    return out.getvalue().encode()


class ViewServer(http.server.ThreadingHTTPServer):
    """speedscope's files from `root`, and `profile` (bytes) at /profile/NAME."""

    daemon_threads = True

    def __init__(self, root: Path, name: str, profile: bytes, host: str, port: int):
        self.root, self.profile = root, profile
        self.profile_path = PROFILE_PREFIX + urllib.parse.quote(name)
        super().__init__((host, port), functools.partial(_Handler, directory=str(root)))

    def url(self) -> str:
        host, port = self.server_address[:2]
        host = f"[{host}]" if ":" in host else host
        # speedscope fetches profileURL itself: it only does so from an http(s) page
        return f"http://{host}:{port}/index.html#profileURL={urllib.parse.quote(self.profile_path)}"

    def start(self) -> threading.Thread:
        t = threading.Thread(target=self.serve_forever, name="trace-view", daemon=True)
        t.start()
        return t


class _Handler(http.server.SimpleHTTPRequestHandler):
    server: ViewServer

    def do_GET(self) -> None:
        if urllib.parse.urlsplit(self.path).path == self.server.profile_path:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(self.server.profile)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(self.server.profile)
            return
        super().do_GET()

    def log_message(self, format: str, *args) -> None:  # noqa: A002 (the base's name)
        pass  # a browser's requests are no news to the person who opened it
