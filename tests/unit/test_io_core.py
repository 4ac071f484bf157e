"""The I/O engine's pure parts: read_files rounds, device polling from sysfs, O_DIRECT
alignment, the benchmark's size parsing, summaries and ratios."""

import errno
import os

import pytest
from click.testing import CliRunner

from xhagent.bench import io as bench
from xhagent.bench.io import (
    fio_argv,
    merge_runs,
    paired,
    parse_fio,
    parse_size,
    ratios,
    summarize,
    targets_met,
)
from xhagent.io.direct import alignment_problem, device_polls, logical_block
from xhagent.io.files import GROWTH, FileRounds


def test_a_whole_round_completes_from_one_buffer():
    rounds = FileRounds(["a", "b", "c", "d"], first=4)
    rounds.complete_round([2, 4, -errno.EACCES, 0], b"hi..full" + bytes(8))
    assert rounds.results[0] == b"hi" and rounds.results[3] == b""
    assert rounds.results[2].errno == errno.EACCES and rounds.results[2].filename == "c"
    assert (rounds.pending, rounds.size) == ([1], 4 * GROWTH)
    rounds.complete_round([4 * GROWTH], b"x" * 4 * GROWTH)  # full again: a third round
    assert (rounds.pending, rounds.size) == ([1], 4 * GROWTH * GROWTH)
    rounds.complete_round([70], b"y" * 70 + bytes(4 * GROWTH * GROWTH - 70))
    assert rounds.done and rounds.results[1] == b"y" * 70


def test_paths_are_encoded_back_to_back_and_a_nul_inside_one_is_refused():
    assert FileRounds(["/a", b"/b\xff"]).encoded() == b"/a\0/b\xff\0"
    assert FileRounds(["/a", "/\udcff"]).encoded() == b"/a\0/\xff\0"
    with pytest.raises(ValueError, match="null byte"):
        FileRounds(["/a", "/b\0c"]).encoded()


def _sysfs(tmp_path, majmin, io_poll, partition=False, lbs=512):
    disk = tmp_path / "devices/disk"
    (disk / "queue").mkdir(parents=True)
    (disk / "queue/io_poll").write_text(f"{io_poll}\n")
    (disk / "queue/logical_block_size").write_text(f"{lbs}\n")
    target = disk / "part1" if partition else disk
    target.mkdir(exist_ok=True)
    (tmp_path / "dev/block").mkdir(parents=True)
    (tmp_path / "dev/block" / majmin).symlink_to(target)
    return tmp_path


@pytest.mark.parametrize(
    "io_poll,partition,expected", [(1, False, True), (0, False, False), (1, True, True)]
)
def test_device_polls_reads_the_disk_queue(tmp_path, io_poll, partition, expected):
    root = _sysfs(tmp_path, "259:1", io_poll, partition, lbs=4096)
    dev = os.makedev(259, 1)
    assert device_polls(dev, root) is expected
    assert logical_block(dev, root) == 4096
    assert device_polls(os.makedev(8, 0), root) is False  # unknown device: no polling


def test_alignment_problem_names_each_misaligned_part():
    assert alignment_problem(4096, 4096, 8192, 512) is None
    msg = alignment_problem(100, 4096, 8193, 512)
    assert "offset 100" in msg and "buffer address 8193" in msg and "length" not in msg


@pytest.mark.parametrize(
    "text,value",
    [
        ("1G", 10**9),
        ("1Gi", 1 << 30),
        ("256M", 256 * 10**6),
        ("256Mi", 256 << 20),
        ("64MiB", 64 << 20),
        ("2048K", 2048 * 10**3),
        ("2048Ki", 2 << 20),
    ],
)
def test_parse_size(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize(
    "text", ["12X", "", "1K", "lots", "1M", "1000Ki", "16gb", "1.5", "9" * 400 + "G"]
)
def test_parse_size_rejects(text):
    with pytest.raises(ValueError):
        parse_size(text)


def test_summary_percentiles_and_ratios():
    s = summarize(1000, 0.5, list(range(1000, 101000, 100)))
    assert s["ops_per_s"] == 2000 and s["p50_us"] == 51.0 and s["p99_us"] == 100.0
    cases = {
        "pagecache_pread": {"ops_per_s": 100, "p50_us": 1},
        "pagecache_engine_qd32": {"ops_per_s": 150, "p50_us": 2},
        "direct_engine_qd1": {"ops_per_s": 10, "p50_us": 40},
        "direct_iopoll_qd1": {"ops_per_s": 12, "p50_us": 30},
    }
    named = ratios(cases)
    assert named == {
        "pagecache_engine_qd32_vs_pread": 1.5,
        "direct_iopoll_qd1_vs_interrupt_qd1_p50_ratio": 0.75,
    }
    assert targets_met(named) == {
        "pagecache_engine_qd32_vs_pread": True,
        "direct_iopoll_qd1_vs_interrupt_qd1_p50_ratio": True,
    }


def test_bench_io_bad_size_is_a_clear_error():
    from xhagent.cli import main

    res = CliRunner().invoke(main, ["bench", "io", "--size", "12X"])
    assert res.exit_code == 2 and "--size" in res.output and "Traceback" not in res.output


FIO_JSON = """\
note: both iodepth >= 1 and synchronous I/O engine are selected, queue depth will be capped at 1
{"fio version": "fio-3.33", "jobs": [{"jobname": "xhagent-bench", "error": 0,
 "read": {"iops": 1000.5, "total_ios": 2001, "runtime": 2000,
 "clat_ns": {"percentile": {"50.000000": 1500, "99.000000": 9000}}}}]}
"""


def test_fio_argv_is_a_list_with_the_engine_s_parameters():
    argv = fio_argv("/data/a:b", direct=True, seconds=0.25, timed=False)
    assert argv[0] == "fio" and "--filename=/data/a\\:b" in argv and "--readonly" in argv
    assert {
        "--ioengine=io_uring",
        "--iodepth=32",
        "--direct=1",
        "--fixedbufs",
        "--registerfiles",
        "--norandommap",
        "--invalidate=0",
        "--runtime=250ms",
        "--bs=4096",
        "--gtod_reduce=1",
    } <= set(argv)
    psync = fio_argv("/f", direct=False, seconds=2, timed=True)
    assert "--ioengine=psync" in psync and "--direct=0" in psync and "--gtod_reduce=1" not in psync


def test_parse_fio_skips_notes_and_reads_ops_and_percentiles():
    assert parse_fio(FIO_JSON) == {"ops_per_s": 1000.5, "ops": 2001, "p50_us": 1.5, "p99_us": 9.0}
    with pytest.raises(ValueError, match="fio job error 5"):
        parse_fio(FIO_JSON.replace('"error": 0', '"error": 5'))


def test_merge_runs_weighs_by_time_and_takes_median_latencies():
    runs = [
        {"ops_per_s": 100.0, "ops": 100, "p50_us": 1, "p99_us": 5, "min_inflight": 32},
        {"ops_per_s": 300.0, "ops": 300, "p50_us": 3, "p99_us": 7, "min_inflight": 30},
        {"ops_per_s": 200.0, "ops": 200, "p50_us": 2, "p99_us": 9, "min_inflight": 32},
    ]
    merged = merge_runs(runs)
    assert (
        merged["ops_per_s"] == 200.0
        and merged["ops"] == 600
        and merged["p50_us"] == 2
        and merged["p99_us"] == 7
    )
    assert merged["min_inflight"] == 30 and merged["runs_ops_per_s"] == [100.0, 300.0, 200.0]


def test_without_fio_the_bench_says_so_and_omits_the_peer(monkeypatch):
    monkeypatch.setattr(bench.shutil, "which", lambda name: None)
    cases, notes, pairs = {}, {}, {}
    paired(
        lambda: {"ops_per_s": 5.0, "ops": 5, "p50_us": 1, "p99_us": 2},
        lambda: pytest.fail("fio run"),
        "direct_engine_qd32",
        "direct_fio_qd32",
        "direct_engine_qd32_vs_fio",
        cases,
        notes,
        pairs,
    )
    assert (
        set(cases) == {"direct_engine_qd32"}
        and pairs == {}
        and "fio is not installed" in notes["fio"]
    )
    assert "direct_engine_qd32_vs_fio" not in ratios(cases)


def test_fio_runs_alternate_with_the_engine_and_a_failure_is_a_note(monkeypatch):
    monkeypatch.setattr(bench.shutil, "which", lambda name: "/usr/bin/fio")
    order = []

    def engine():
        order.append("engine")
        return {"ops_per_s": 10.0, "ops": 10, "p50_us": 1, "p99_us": 2}

    def fio():
        order.append("fio")
        return {"ops_per_s": 20.0, "ops": 20, "p50_us": 1, "p99_us": 2}

    cases, notes, pairs = {}, {}, {}
    paired(engine, fio, "e", "f", "e_vs_f", cases, notes, pairs)
    assert order[:4] == ["engine", "fio", "fio", "engine"] and len(order) == 2 * bench.FIO_PAIRS
    assert pairs["e_vs_f"] == [0.5] * bench.FIO_PAIRS

    def broken():
        raise OSError("fio exited 1: bad option")

    cases, notes = {}, {}
    paired(engine, broken, "e", "f", "e_vs_f", cases, notes, {})
    assert set(cases) == {"e"} and "fio failed" in notes["f"] and "bad option" in notes["f"]
