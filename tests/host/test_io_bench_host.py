"""`xhagent bench io` end to end on this host, in a very short run: every case and ratio is
in the JSON, and bad input is a clear error."""

import json
import os
import shutil

import pytest

from xhagent.cgroups import discover_hierarchy

pytestmark = pytest.mark.host

FILE_SETS = ("tree", "proc", "cgroupfs", "cgroup")
SAMPLER_WAYS = ("kept_pread", "sampler", "sampler_packed", "sampler_pread", "sampler_reread")
FILE_CASES = {
    f"files_{s}_{w}"
    for s in FILE_SETS
    for w in ("loop", "read_files", "uring", "syscalls") + SAMPLER_WAYS
}
SAMPLER_TARGETS = {
    f"files_{s}_sampler_vs_{peer}"
    for s in ("tree", "proc", "cgroup")
    for peer in ("loop", "kept_pread")
}
CASES = {
    "pagecache_pread",
    "pagecache_engine_qd32",
    "pagecache_threadpool_qd32",
    "pagecache_asyncring_qd32",
    "direct_pread",
    "direct_engine_qd1",
    "direct_engine_qd32",
} | FILE_CASES


def bench_groups() -> set[str]:
    root = discover_hierarchy().unified.path
    return {d for d in os.listdir(root) if d.startswith("xhagent-bench-io-")}


def test_bench_io_json_has_every_case_and_ratio(run_xhagent):
    groups_before = bench_groups()
    res = run_xhagent("bench", "io", "--json", "--size", "8M", "--seconds", "0.1", timeout=120)
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    assert CASES <= set(report["cases"])
    for case in report["cases"].values():
        assert case["ops_per_s"] > 0 and 0 < case["p50_us"] <= case["p99_us"]
    assert {
        "pagecache_engine_qd32_vs_pread",
        "pagecache_engine_qd32_vs_threadpool",
        "pagecache_asyncring_vs_threadpool",
        "direct_engine_qd32_vs_pread",
        "files_tree_read_files_vs_loop",
        "files_proc_read_files_vs_loop",
        "files_cgroupfs_uring_vs_loop",
        "files_tree_syscalls_vs_loop",
    } <= set(report["ratios"])
    # the tree in tmp (ext4) goes through io_uring; /proc and cgroupfs files by system calls
    assert report["notes"]["files_tree"].endswith(
        "read_files reads 0 with system calls, 1000 through io_uring"
    )
    assert (
        ", 0 through io_uring" in report["notes"]["files_proc"]
        and ", 0 through" in report["notes"]["files_cgroupfs"]
    )
    assert "io_poll" in report["notes"]["iopoll"]  # no polling device on this host: said so
    # the kept-open cases: measured per CPU second of the thread, each ratio with its target
    for s in FILE_SETS:
        for w in ("loop",) + SAMPLER_WAYS:
            assert report["cases"][f"files_{s}_{w}"]["ops_per_cpu_s"] > 0
    assert SAMPLER_TARGETS <= set(report["targets_met"]) and SAMPLER_TARGETS <= set(
        report["ratios"]
    )
    # the ceiling of each Sampler ratio: the C pass alone, building nothing
    for s in ("tree", "proc", "cgroup"):
        for peer in ("loop", "kept_pread"):
            assert report["ratios"][f"files_{s}_reread_vs_{peer}"] > 0
    # the tree's files go through the ring unless timing showed pread faster (as it does
    # here): then every one of them by pread, and the note says why
    note = report["notes"]["files_tree_sampler"]
    kept = note.endswith("; the ring's pass was timed faster than pread's, and kept")
    assert kept or note.endswith("; the ring's pass was timed slower than pread's: pread for all")
    ways = "1000 through io_uring (registered files) and 0" if kept else "0 through io_uring"
    assert note.startswith(f"1000 files held open; a sample reads {ways}")
    assert kept or "(registered files) and 1000 with pread" in note
    n_cgroup = int(report["notes"]["files_cgroup"].split()[0])
    assert n_cgroup >= 200 and report["notes"]["files_cgroup_sampler"].startswith(
        f"{n_cgroup} files held open; a sample reads 0 through io_uring (registered files) and "
        f"{n_cgroup} with pread"
    )
    assert bench_groups() <= groups_before  # the bench removed the groups it made
    assert "page cache" in res.stderr  # progress
    # the engine cases are streams that kept their queue full; O_DIRECT with fixed file and buffers
    for name, depth in (
        ("pagecache_engine_qd32", 32),
        ("direct_engine_qd32", 32),
        ("direct_engine_qd1", 1),
    ):
        assert 1 <= report["cases"][name]["min_inflight"] <= depth
    assert (
        "plain buffer ops 0" in report["notes"]["direct"]
        and "fixed buffer ops 0" not in report["notes"]["direct"]
    )
    if shutil.which("fio"):  # fio as a peer: alternating runs, a ratio per pair
        assert {"direct_fio_qd32", "pagecache_fio_psync"} <= set(
            report["cases"]
        ) and "fio" not in report["notes"]
        for ratio in ("direct_engine_qd32_vs_fio", "pagecache_engine_qd32_vs_fio_psync"):
            assert report["ratios"][ratio] > 0 and len(report["ratio_runs"][ratio]) == 3
        assert len(report["cases"]["direct_fio_qd32"]["runs_ops_per_s"]) == 3
    else:
        assert (
            "fio is not installed" in report["notes"]["fio"]
            and "direct_engine_qd32_vs_fio" not in report["ratios"]
        )


def test_bench_io_missing_file_is_a_clear_error(run_xhagent):
    res = run_xhagent("bench", "io", "--file", "/nonexistent/disk")
    assert (
        res.returncode == 2
        and "/nonexistent/disk: No such file or directory" in res.stderr
        and "Traceback" not in res.stderr
    )
