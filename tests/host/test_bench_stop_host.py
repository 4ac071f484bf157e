"""A benchmark stopped by a signal cleans up as one that ends: `xhagent bench agent` told
SIGTERM (or SIGHUP) while its scratch agent runs exits 128+N with one line saying so, and
leaves no scratch agent, no subtree and no scratch directory behind."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from xhagent.cgroups.mounts import discover_hierarchy

pytestmark = pytest.mark.host

XHAGENT = Path(sys.executable).with_name("xhagent")


def scratch_agents(bench_pid: int) -> list[int]:
    """The bench's children that are scratch agents (`xhagent run`)."""
    out = []
    for task in Path(f"/proc/{bench_pid}/task").iterdir():
        for pid in (task / "children").read_text().split():
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"run" in cmd and b"--subtree" in cmd:
                out.append(int(pid))
    return out


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_stopped_bench_stops_its_scratch_agent_and_removes_what_it_made(tmp_path, sig):
    env = dict(os.environ, TMPDIR=str(tmp_path))  # its scratch directory goes here
    bench = subprocess.Popen(
        [str(XHAGENT), "bench", "agent", "--only", "idle", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        deadline = time.monotonic() + 60
        while not (agents := scratch_agents(bench.pid)) or not list(tmp_path.iterdir()):
            assert bench.poll() is None, bench.communicate()
            assert time.monotonic() < deadline, "no scratch agent in 60 s"
            time.sleep(0.1)
        time.sleep(1)  # past its start: it answers Health, the bench measures it
        bench.send_signal(sig)
        out, err = bench.communicate(timeout=60)
    finally:
        if bench.poll() is None:
            bench.kill()
    assert bench.returncode == 128 + sig, err
    assert err.splitlines()[-1] == f"xhagent: stopped by {signal.Signals(sig).name}"
    assert "Traceback" not in err and out == ""
    for pid in agents:
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text()
    root = Path(discover_hierarchy().unified.path)
    assert not (root / f"xhagent-bench-agent-{bench.pid}.slice").exists()
    assert list(tmp_path.iterdir()) == []
