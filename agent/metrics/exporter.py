"""The metrics endpoint: `GET /metrics` of a prometheus_client registry over HTTP, in the
Prometheus text format or OpenMetrics (by the scraper's Accept header).

    exporter = Exporter(registry, parse_addr("127.0.0.1:9464"))
    exporter.start()                  # serving on its own thread
    exporter.address                  # ("127.0.0.1", 9464): the port bound, also for port 0
    exporter.stop()

With `debug=True` it also serves /debug/stacks, /debug/profile?seconds=N and /debug/heap
(`xhagent.metrics.debug`): off unless asked for, and loopback by default like /metrics.

Why not prometheus_client's `start_http_server`: its thread polls for a shutdown request
twice a second, and on a VM each wake-up from idle is charged to the agent (see `xhagent
bench agent`). This server's thread sleeps in accept() until a scraper connects; stop()
wakes it with a connection of its own.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

DEFAULT_ADDR = "127.0.0.1:9464"


def parse_addr(text: str) -> tuple[str, int]:
    """`HOST:PORT` (an IPv6 host in brackets) -> (host, port); ValueError naming the fault."""
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise ValueError(f"{text!r}: expected HOST:PORT, e.g. {DEFAULT_ADDR}")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if host != "localhost":
            raise ValueError(f"{text!r}: the host must be an IP address or localhost") from None
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{text!r}: the port must be a number from 0 to 65535")
    return host, int(port)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, addr: tuple[str, int], handler, registry: CollectorRegistry, debug: bool):
        self.address_family = socket.AF_INET6 if ":" in addr[0] else socket.AF_INET
        self.registry = registry
        self.debug = debug
        self.stopping = False
        super().__init__(addr, handler)


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        url = urlsplit(self.path)
        if url.path.startswith("/debug/") and self.server.debug:
            self._debug(url.path.removeprefix("/debug/"), parse_qs(url.query))
            return
        if url.path != "/metrics":
            self.send_error(404, "only /metrics is served here")
            return
        encode, content_type = choose_encoder(self.headers.get("Accept", ""))
        try:
            body = encode(self.server.registry)
        except Exception as exc:  # a collector failed: the scraper sees it, the agent goes on
            self.send_error(500, f"collecting metrics failed: {exc}")
            return
        self._send(body, content_type)

    def _debug(self, what: str, query: dict) -> None:
        from . import debug

        try:
            if what == "stacks":
                text = debug.stacks()
            elif what == "profile":
                text = debug.profile(float(query.get("seconds", ["10"])[0]))
            elif what == "heap":
                text = debug.heap()
            else:
                self.send_error(404, "debug endpoints: stacks, profile?seconds=N, heap")
                return
        except ValueError as exc:
            self.send_error(400, str(exc))
            return
        self._send(text.encode(), "text/plain; charset=utf-8")

    def _send(self, body: bytes, content_type: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args) -> None:  # noqa: A002
        pass  # a scrape a second is not news


class Exporter:
    def __init__(self, registry: CollectorRegistry, addr: tuple[str, int], debug: bool = False):
        try:
            self._server = _Server(addr, _Handler, registry, debug)
        except OSError as exc:
            raise OSError(exc.errno, f"metrics on {addr[0]}:{addr[1]}: {exc.strerror}") from None
        self._thread = threading.Thread(target=self._serve, name="xhagent-metrics", daemon=True)

    @property
    def address(self) -> tuple[str, int]:
        return self._server.server_address[:2]

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://{f'[{host}]' if ':' in host else host}:{port}/metrics"

    def start(self) -> None:
        self._thread.start()

    def _serve(self) -> None:
        while not self._server.stopping:
            self._server.handle_request()  # blocks in accept(); timeout None

    def stop(self) -> None:
        self._server.stopping = True
        if self._thread.is_alive():
            try:  # the thread is in accept(): one connection lets it see `stopping`
                with socket.create_connection(self.address, timeout=2):
                    pass
            except OSError:
                pass
            self._thread.join(5)
        self._server.server_close()
