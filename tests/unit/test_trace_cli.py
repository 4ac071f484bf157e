"""`xhagent trace` on files, without root: bad input is a message and exit 1, never a
traceback; outputs land where asked."""
import json

from click.testing import CliRunner
from trace_samples import sample_events, sample_header

from xhagent.trace.cli import trace
from xhagent.trace.fmt import write_trace


def run(*args):
    return CliRunner().invoke(trace, list(args))


def sample(tmp_path):
    path = tmp_path / "t.xht"
    write_trace(path, sample_header(), sample_events())
    return str(path)


def test_stats_json(tmp_path):
    res = run("stats", sample(tmp_path), "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert {t["pid"] for t in doc["tasks"]} >= {100, 200, 300}


def test_lost_events_are_reported(tmp_path):
    path = tmp_path / "lost.xht"
    h = sample_header()
    h.lost = 5
    write_trace(path, h, sample_events())
    res = run("stats", str(path))
    assert res.exit_code == 0
    assert "5 events were LOST" in res.stderr and "5 lost" in res.stdout


def test_not_a_trace(tmp_path):
    bad = tmp_path / "bad.xht"
    bad.write_text("hello")
    for args in (("stats", str(bad)), ("export", str(bad), "--format", "perf", "-o", "-"),
                 ("heatmap", str(bad), "-o", str(tmp_path / "h.svg"))):
        res = run(*args)
        assert res.exit_code == 1, res.output
        assert f"{bad}: not an xhagent trace" in res.stderr
        assert "Traceback" not in res.output


def test_export_to_file_and_stdout(tmp_path):
    path = sample(tmp_path)
    res = run("export", path, "--format", "perf", "-o", "-")
    assert res.exit_code == 0 and len(res.stdout.splitlines()) == len(sample_events())
    out = tmp_path / "c.json"
    res = run("export", path, "--format", "chrome", "-o", str(out))
    assert res.exit_code == 0 and json.loads(out.read_text())["traceEvents"]


def test_export_unknown_format(tmp_path):
    res = run("export", sample(tmp_path), "--format", "pdf", "-o", "-")
    assert res.exit_code == 2 and "pdf" in res.output


def test_heatmap_needs_svg_or_png(tmp_path):
    res = run("heatmap", sample(tmp_path), "-o", str(tmp_path / "h.jpg"))
    assert res.exit_code == 1 and "must end in .svg or .png" in res.stderr


def test_heatmap_too_many_bins(tmp_path):
    res = run("heatmap", sample(tmp_path), "-o", str(tmp_path / "h.svg"), "--bin-ms", "0.0001")
    assert res.exit_code == 1 and "--bin-ms" in res.stderr


def test_heatmap_png(tmp_path):
    out = tmp_path / "h.png"
    res = run("heatmap", sample(tmp_path), "-o", str(out), "--bin-ms", "1")
    assert res.exit_code == 0, res.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_record_rejects_unknown_events(tmp_path):
    res = run("record", "-o", str(tmp_path / "x"), "--events", "switch,bogus", "--duration", "1")
    assert res.exit_code == 2 and "bogus" in res.stderr
