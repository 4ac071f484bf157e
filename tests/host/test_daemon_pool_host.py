"""`xhagent run --pool`: the agent hosts a runtime worker pool on this host, each worker
pinned in its leaf `<subtree>/pool/<cpu>`; another process submits to it through
`agent_pool()`; its figures are on the agent's /metrics; a SIGTERM removes it; after a
kill -9 the idle workers stop and the next agent clears what is left."""

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from xhagent.bench.local_agent import LocalAgent
from xhagent.cgroups.mounts import discover_hierarchy
from xhagent.daemon.api.client import connect
from xhagent.daemon.api.v1 import agent_pb2 as pb

pytestmark = pytest.mark.host

# Another process: its tasks are stdlib functions, which the agent's workers can import.
CLIENT = """
import json, math, os, sys, time
from xhagent.daemon.api.pool_client import agent_pool
with agent_pool(sys.argv[1]) as pool:
    if sys.argv[2] == "work":
        facts = [f.result(30) for f in [pool.submit(math.factorial, n) for n in range(200)]]
        pids = sorted({pool.submit(os.getpid).result(30) for _ in range(50)})
        print(json.dumps({"ok": facts == [math.factorial(n) for n in range(200)], "pids": pids}))
    else:  # leave one worker busy for a minute, and stay while it is
        pool.submit(time.sleep, 60)
        print("submitted", flush=True)
        time.sleep(120)
"""


@pytest.fixture
def agent(tmp_path):
    a = LocalAgent(
        tmp_path,
        f"xhagent-pool-test-{os.getpid()}-{tmp_path.name[-12:]}.slice",
        extra=("--pool", "auto"),
    )
    a.start()
    yield a
    a.stop()
    a.remove_subtree()


def pool_dir(a: LocalAgent) -> Path:
    return Path(discover_hierarchy().unified.path) / a.subtree / "pool"


def workers(a: LocalAgent) -> dict[int, int]:
    """cpu -> the pid in its leaf."""
    out = {}
    for leaf in pool_dir(a).iterdir():
        if leaf.is_dir():
            (pid,) = [int(p) for p in (leaf / "cgroup.procs").read_text().split()]
            out[int(leaf.name)] = pid
    return out


def health(a: LocalAgent):
    with connect(a.socket, timeout=10) as client:
        return client.Health(pb.HealthRequest())


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/status").read_text().find("State:\tZ") < 0


def test_another_process_runs_work_on_the_agents_pinned_workers(agent):
    cpus = sorted(os.sched_getaffinity(0))
    pool = json.loads(health(agent).pool_json)
    assert pool["cpus"] == cpus
    found = workers(agent)
    assert sorted(found) == cpus  # one leaf per CPU, one worker in each
    for cpu, pid in found.items():
        status = Path(f"/proc/{pid}/status").read_text()
        assert f"Cpus_allowed_list:\t{cpu}\n" in status
    got = subprocess.run(
        [sys.executable, "-c", CLIENT, str(agent.socket), "work"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert got.returncode == 0, got.stderr
    result = json.loads(got.stdout)
    assert result["ok"]
    assert set(result["pids"]) <= set(found.values())  # the tasks ran in the agent's workers

    text = urllib.request.urlopen(agent.metrics_url(), timeout=10).read().decode()
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
    alive_workers = [s.value for s in samples if s.name == "xhagent_pool_workers"]
    assert {"state": "alive"} in [s.labels for s in samples if s.name == "xhagent_pool_workers"]
    assert max(alive_workers) == len(cpus)
    done = sum(s.value for s in samples if s.name == "xhagent_pool_tasks_total")
    assert done >= 250

    assert agent.stop() == 0
    assert not pool_dir(agent).exists()  # its leaves went with it
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in found.values()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(alive(pid) for pid in found.values())


def test_after_a_kill_9_idle_workers_stop_and_the_next_agent_clears_the_busy_one(agent):
    old = workers(agent)
    client = subprocess.Popen(
        [sys.executable, "-c", CLIENT, str(agent.socket), "busy"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert client.stdout.readline().strip() == "submitted"
        time.sleep(0.5)  # a worker has taken the sleep
        agent.proc.send_signal(signal.SIGKILL)
        agent.proc.wait(10)
        # an idle worker sees its owner gone at its next wait (IDLE_WAIT, 0.5 s)
        deadline = time.monotonic() + 10
        while all(alive(pid) for pid in old.values()) and time.monotonic() < deadline:
            time.sleep(0.05)
        still = [pid for pid in old.values() if alive(pid)]
        assert len(still) < len(old)
        if len(old) > 1:
            assert len(still) == 1  # the one in time.sleep(60)
        agent.start()
        log = agent.tail(40)
        if still:
            assert "PoolLeftovers: removed pool/" in log, log
        assert not any(alive(pid) for pid in still)
        new = workers(agent)
        assert sorted(new) == sorted(old) and not set(new.values()) & set(old.values())
        got = subprocess.run(
            [sys.executable, "-c", CLIENT, str(agent.socket), "work"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert got.returncode == 0 and json.loads(got.stdout)["ok"], got.stderr
    finally:
        client.kill()
        client.wait()


def test_a_pool_on_cpus_the_agent_cannot_use_is_refused_before_anything(tmp_path):
    state = tmp_path / "state"
    res = subprocess.run(
        [sys.executable, "-m", "xhagent.cli", "run", "--pool", "4000-4001"]
        + ["--state-dir", str(state), "--socket", str(tmp_path / "s.sock")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 2
    assert "--pool: CPUs 4000-4001 are not the agent's to use (its affinity is" in res.stderr
    assert not state.exists() and not (tmp_path / "s.sock").exists()


def test_an_agent_without_a_pool_says_so_to_a_client(tmp_path):
    a = LocalAgent(tmp_path, f"xhagent-pool-test-{os.getpid()}-none.slice")
    a.start()
    try:
        assert health(a).pool_json == ""
        from xhagent.daemon.api.pool_client import agent_pool

        with pytest.raises(RuntimeError, match=r"hosts no pool \(xhagent run --pool\)"):
            agent_pool(a.socket)
    finally:
        a.stop()
        a.remove_subtree()
