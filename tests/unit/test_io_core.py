"""The I/O engine's pure parts: read_files rounds, device polling from sysfs, O_DIRECT
alignment, the benchmark's size parsing, summaries and ratios."""
import errno
import os

import pytest
from click.testing import CliRunner

from xhagent.io.bench import parse_size, ratios, summarize, targets_met
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


@pytest.mark.parametrize("io_poll,partition,expected", [(1, False, True), (0, False, False), (1, True, True)])
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


@pytest.mark.parametrize("text,value", [("1G", 1 << 30), ("256M", 256 << 20), ("64MiB", 64 << 20), ("2048K", 2 << 20)])
def test_parse_size(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["12X", "", "1K", "lots"])
def test_parse_size_rejects(text):
    with pytest.raises(ValueError):
        parse_size(text)


def test_summary_percentiles_and_ratios():
    s = summarize(1000, 0.5, list(range(1000, 101000, 100)))
    assert s["ops_per_s"] == 2000 and s["p50_us"] == 51.0 and s["p99_us"] == 100.0
    cases = {"pagecache_pread": {"ops_per_s": 100, "p50_us": 1}, "pagecache_engine_qd32": {"ops_per_s": 150, "p50_us": 2},
             "direct_engine_qd1": {"ops_per_s": 10, "p50_us": 40}, "direct_iopoll_qd1": {"ops_per_s": 12, "p50_us": 30}}
    named = ratios(cases)
    assert named == {"pagecache_engine_qd32_vs_pread": 1.5, "direct_iopoll_qd1_vs_interrupt_qd1_p50_ratio": 0.75}
    assert targets_met(named) == {"pagecache_engine_qd32_vs_pread": True,
                                  "direct_iopoll_qd1_vs_interrupt_qd1_p50_ratio": True}


def test_bench_io_bad_size_is_a_clear_error():
    from xhagent.cli import main

    res = CliRunner().invoke(main, ["bench", "io", "--size", "12X"])
    assert res.exit_code == 2 and "--size" in res.output and "Traceback" not in res.output
