"""`xhagent trace view` without a browser: what its loopback server hands speedscope,
and how it says that speedscope is missing."""

import io
import json
import urllib.error
import urllib.request

import pytest
from click.testing import CliRunner
from trace_samples import sample_events, sample_header

from xhagent.trace.cli import trace
from xhagent.trace.export import write_chrome
from xhagent.trace.fmt import TraceFile, write_trace
from xhagent.trace.view import ViewServer, chrome_json


@pytest.fixture
def speedscope(tmp_path):
    root = tmp_path / "release"
    root.mkdir()
    (root / "index.html").write_text("<html>speedscope</html>")
    (tmp_path / "secret").write_text("not for the browser")
    return root


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, b""


def test_serves_speedscope_and_the_chrome_export_on_loopback(tmp_path, speedscope):
    path = tmp_path / "t.xht"
    write_trace(path, sample_header(), sample_events())
    expected = io.StringIO()
    write_chrome(TraceFile(path), expected)
    server = ViewServer(speedscope, "t.xht.json", chrome_json(str(path)), "127.0.0.1", 0)
    with server:
        server.start()
        url = server.url()
        assert url.startswith("http://127.0.0.1:") and "#profileURL=/profile/t.xht.json" in url
        base = url.split("index.html")[0]
        assert get(base + "index.html") == (200, b"<html>speedscope</html>")
        status, body = get(base + "profile/t.xht.json")
        assert status == 200 and json.loads(body) == json.loads(expected.getvalue())
        # only speedscope's directory is served
        assert get(base + "..%2fsecret")[0] == 404
        assert get(base + "../secret")[0] == 404
        server.shutdown()


def test_missing_speedscope_is_one_line_naming_the_setup(tmp_path, monkeypatch):
    path = tmp_path / "t.xht"
    write_trace(path, sample_header(), sample_events())
    res = CliRunner().invoke(trace, ["view", str(path), "--speedscope", str(tmp_path)])
    assert res.exit_code == 2 and "tools/setup-viewer" in res.stderr, res.output
    monkeypatch.setenv("XHAGENT_SPEEDSCOPE", str(tmp_path))
    monkeypatch.setattr("xhagent.trace.view.CHECKOUT_SPEEDSCOPE", tmp_path / "none")
    res = CliRunner().invoke(trace, ["view", str(path)])
    assert res.exit_code == 1 and "speedscope not found" in res.stderr, res.output
    assert "Traceback" not in res.output


def test_a_bad_trace_file_is_bad_input(tmp_path, speedscope):
    bad = tmp_path / "bad.xht"
    bad.write_bytes(b"XHTRACE\0" + b"\0" * 8)
    res = CliRunner().invoke(trace, ["view", str(bad), "--speedscope", str(speedscope)])
    assert res.exit_code == 2 and str(bad) in res.stderr, res.output


def test_an_empty_file_a_fifo_or_a_device_is_refused_before_any_read(tmp_path, speedscope):
    import os

    empty = tmp_path / "empty.json"
    empty.write_bytes(b"")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # a read would block for ever
    for path, why in [(empty, "empty: nothing to view"), (fifo, "not a regular file")]:
        res = CliRunner().invoke(trace, ["view", str(path), "--speedscope", str(speedscope)])
        assert res.exit_code == 2 and why in res.output, res.output
