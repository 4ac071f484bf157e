"""`xhagent trace` on files: bad input (options, trace files, output paths) is a message
and exit 2, never a traceback; outputs land where asked, whole or not at all."""

import json
import os
import re

import pytest
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
    assert all(SNAKE.match(k) for k in all_keys(doc) if not k.isdigit())


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
    for args in (
        ("stats", str(bad)),
        ("export", str(bad), "--format", "perf", "-o", "-"),
        ("heatmap", str(bad), "-o", str(tmp_path / "h.svg")),
    ):
        res = run(*args)
        assert res.exit_code == 2, res.output
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
    assert res.exit_code == 2 and "must end in .svg or .png" in res.stderr


def test_heatmap_too_many_bins(tmp_path):
    res = run("heatmap", sample(tmp_path), "-o", str(tmp_path / "h.svg"), "--bin-ms", "0.0001")
    assert res.exit_code == 2 and "--bin-ms" in res.stderr


def test_heatmap_png(tmp_path):
    out = tmp_path / "h.png"
    res = run("heatmap", sample(tmp_path), "-o", str(out), "--bin-ms", "1")
    assert res.exit_code == 0, res.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_record_rejects_unknown_events(tmp_path):
    res = run("record", "-o", str(tmp_path / "x"), "--events", "switch,bogus", "--duration", "1")
    assert res.exit_code == 2 and "bogus" in res.stderr


def bad_trace_files(tmp_path):
    """Each class of bad trace file, and the message that names it."""
    from trace_samples import trace_bytes

    from xhagent.trace.fmt import Header

    files = {
        "empty": (b"", "not an xhagent trace (only 0 bytes)"),
        "garbage": (bytes(range(256)) * 20, "not an xhagent trace (bad magic at offset 0)"),
        "meta_list": (
            trace_bytes(Header(0, [1])),
            "metadata at offset 48 is an array, not an object",
        ),
        "ncpus_float": (
            trace_bytes(Header(0, {"ncpus": 1.5})),
            "ncpus is a number, not an integer",
        ),
        "ncpus_huge": (
            trace_bytes(Header(0, {"ncpus": 10**9})),
            "ncpus 1000000000 is out of range",
        ),
        "type_99": (
            trace_bytes(events=[sample_events()[0]._replace(type=99)]),
            "record 0 at offset 4,144: unknown type 99",
        ),
        "cut": (trace_bytes()[:4200], "truncated: 0 of 13 declared records"),
    }
    for name, (data, message) in files.items():
        (tmp_path / name).write_bytes(data)
        yield str(tmp_path / name), message
    yield "/dev/zero", "/dev/zero: is a character device, not a regular file"


def test_bad_trace_files_exit_2_with_the_file_named_for_every_reader(tmp_path):
    for path, message in bad_trace_files(tmp_path):
        for args in (
            ("stats", path),
            ("stats", path, "--json"),
            ("export", path, "--format", "perf", "-o", "-"),
            ("export", path, "--format", "chrome", "-o", str(tmp_path / "c.json")),
            ("heatmap", path, "-o", str(tmp_path / "h.png")),
        ):
            res = run(*args)
            assert res.exit_code == 2, (args, res.output, res.exception)
            assert res.stderr.startswith(f"xhagent trace: {path}") and message in res.stderr, (
                res.stderr
            )
            assert "Traceback" not in res.output and not isinstance(res.exception, MemoryError)
        assert not (tmp_path / "c.json").exists() and not (tmp_path / "h.png").exists()


def test_allow_truncated_reads_a_cut_trace_with_a_warning(tmp_path):
    from trace_samples import trace_bytes

    path = tmp_path / "cut.xht"
    path.write_bytes(trace_bytes()[: -2 * 80 - 7])
    res = run("stats", str(path), "--json")
    assert res.exit_code == 2 and "truncated: 10 of 13 declared records" in res.stderr
    assert "--allow-truncated reads what is there" in res.stderr
    res = run("stats", str(path), "--json", "--allow-truncated")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["events"] == 10
    assert (
        f"{path}: truncated: 10 of 13 declared records" in res.stderr
        and "reading the 10" in res.stderr
    )


def test_an_unfinished_recording_is_read_with_a_warning(tmp_path):
    from trace_samples import trace_bytes

    path = tmp_path / "died.xht"
    path.write_bytes(trace_bytes(complete=False))
    res = run("stats", str(path))
    assert res.exit_code == 0 and "recording did not finish" in res.stderr


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "0", "-1", "x"])
def test_durations_and_bins_must_be_finite_and_positive(tmp_path, value):
    res = run("record", "-o", str(tmp_path / "x"), "--duration", value)
    assert res.exit_code == 2 and "--duration" in res.output, res.output
    res = run("heatmap", sample(tmp_path), "-o", str(tmp_path / "h.svg"), "--bin-ms", value)
    assert res.exit_code == 2 and "--bin-ms" in res.output, res.output
    assert not (tmp_path / "x").exists() and not (tmp_path / "h.svg").exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (("--pid", "4294967296"), "--pid 4294967296: out of range (1..4294967295)"),
        (("--pid", "4194305000"), "--pid 4194305000: no such process"),
        (("--cgroup", "/tmp"), "--cgroup /tmp: not a cgroup v2 directory (file system magic"),
        (("--cgroup", "/nonexistent"), "--cgroup /nonexistent: not a directory"),
        (("--", ""), "the command after -- is empty"),
    ],
)
def test_record_refuses_bad_options_and_leaves_the_output_alone(tmp_path, args, message):
    out = tmp_path / "keep.xht"
    out.write_text("precious")
    res = run("record", "-o", str(out), *args)
    assert res.exit_code == 2, res.output
    assert message in res.stderr and "Traceback" not in res.output
    assert out.read_text() == "precious" and os.listdir(tmp_path) == ["keep.xht"]


def test_outputs_that_are_not_regular_files_are_refused(tmp_path):
    path = sample(tmp_path)
    for args in (
        ("record", "-o", "/dev/null", "--duration", "1"),
        ("export", path, "--format", "perf", "-o", "/dev/null"),
        ("heatmap", path, "-o", str(tmp_path / "dir.svg")),
    ):
        (tmp_path / "dir.svg").mkdir(exist_ok=True)
        res = run(*args)
        assert res.exit_code == 2, res.output
        assert (
            "is a character device; the output must be a regular file" in res.stderr
            or "dir.svg' is a directory" in res.output
        ), res.output
    assert os.path.exists("/dev/null") and os.path.isdir(tmp_path / "dir.svg")


SNAKE = re.compile(r"^[a-z0-9]+(_[a-z0-9]+)*$")


def all_keys(doc):
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield k
            yield from all_keys(v)
    elif isinstance(doc, list):
        for v in doc:
            yield from all_keys(v)


def test_export_failing_half_way_leaves_the_existing_output_untouched(tmp_path, monkeypatch):
    from xhagent.trace import export

    def broken(trace, out):
        out.write("half\n")
        raise OSError(28, "No space left on device")

    monkeypatch.setitem(export.WRITERS, "perf", broken)
    out = tmp_path / "keep.txt"
    out.write_text("precious")
    path = sample(tmp_path)
    res = run("export", path, "--format", "perf", "-o", str(out))
    assert res.exit_code == 1 and f"{out}: cannot write: No space left on device" in res.stderr
    assert out.read_text() == "precious" and sorted(os.listdir(tmp_path)) == ["keep.txt", "t.xht"]


def test_export_to_a_full_stdout_is_a_message_not_a_traceback(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    exe = Path(sys.executable).with_name("xhagent")
    with open("/dev/full", "w") as full:
        res = subprocess.run(
            [str(exe), "trace", "export", sample(tmp_path), "--format", "perf", "-o", "-"],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    assert (
        res.returncode == 1
        and res.stderr == "xhagent trace: standard output: No space left on device\n"
    )


def test_a_signal_while_exporting_leaves_no_temporary_file(tmp_path, monkeypatch):
    import signal

    from xhagent.trace import export

    def interrupted(trace, out):
        out.write("half\n")
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setitem(export.WRITERS, "perf", interrupted)
    res = run("export", sample(tmp_path), "--format", "perf", "-o", str(tmp_path / "new.txt"))
    assert res.exit_code == 143 and "stopped by SIGTERM" in res.stderr
    assert os.listdir(tmp_path) == ["t.xht"]


def test_a_reader_that_goes_away_ends_the_command_quietly(tmp_path):
    """`xhagent trace export ... | head`: no "Broken pipe", no traceback, SIGPIPE's status
    (128+13), as `cat` ends."""
    import signal
    import subprocess
    import sys
    from pathlib import Path

    big = tmp_path / "big.xht"
    write_trace(big, sample_header(), sample_events() * 2000)  # megabytes: far past a pipe's
    exe = Path(sys.executable).with_name("xhagent")
    argv = [str(exe), "trace", "export", str(big), "--format", "perf", "-o", "-"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.readline()  # what `head -1` reads, then it goes
    proc.stdout.close()
    assert proc.wait(timeout=60) == 128 + signal.SIGPIPE
    assert proc.stderr.read() == b""
