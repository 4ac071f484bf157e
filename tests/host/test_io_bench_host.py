"""`xhagent bench io` end to end on this host, in a very short run: every case and ratio is
in the JSON, and bad input is a clear error."""
import json

import pytest

pytestmark = pytest.mark.host

CASES = {"pagecache_pread", "pagecache_engine_qd32", "pagecache_threadpool_qd32", "pagecache_asyncring_qd32",
         "direct_pread", "direct_engine_qd1", "direct_engine_qd32", "files_tree_loop", "files_tree_read_files",
         "files_proc_loop", "files_proc_read_files"}


def test_bench_io_json_has_every_case_and_ratio(run_xhagent):
    res = run_xhagent("bench", "io", "--json", "--size", "8M", "--seconds", "0.1", timeout=120)
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    assert CASES <= set(report["cases"])
    for case in report["cases"].values():
        assert case["ops_per_s"] > 0 and 0 < case["p50_us"] <= case["p99_us"]
    assert {"pagecache_engine_qd32_vs_pread", "pagecache_engine_qd32_vs_threadpool",
            "pagecache_asyncring_vs_threadpool", "direct_engine_qd32_vs_pread",
            "files_tree_read_files_vs_loop", "files_proc_read_files_vs_loop"} <= set(report["ratios"])
    assert "io_poll" in report["notes"]["iopoll"]  # no polling device on this host: said so
    assert "page cache" in res.stderr  # progress


def test_bench_io_missing_file_is_a_clear_error(run_xhagent):
    res = run_xhagent("bench", "io", "--file", "/nonexistent/disk")
    assert res.returncode == 2 and "no such file" in res.stderr and "Traceback" not in res.stderr
