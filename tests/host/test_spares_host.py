"""Spare run directories on this host: the shim takes one by renaming it into place (the same
inodes, no new ones), only for a first attempt whose task directory is not there yet; and an
agent hands them to its starts, says so on /metrics, and makes the pool up once the starts
are over."""

from __future__ import annotations

import json
import os
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from xhagent.bench.local_agent import LocalAgent
from xhagent.daemon.api.v1 import agent_pb2 as pb
from xhagent.daemon.exec.shim import SHIM, read_status, start_shim
from xhagent.daemon.exec.spares import QUIET_S, SpareRunDirs

pytestmark = pytest.mark.host
ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LC_ALL": "C"}


def inodes(path: Path) -> dict[str, int]:
    """Each entry below `path` (itself as "."), by its path, to its inode number."""
    out = {".": path.stat().st_ino}
    for p in path.rglob("*"):
        out[str(p.relative_to(path))] = p.stat().st_ino
    return out


def ended(task_dir: Path, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while (status := read_status(task_dir)).exit is None:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    return status


def one_spare(state: Path) -> Path:
    pool = SpareRunDirs(state, 1, SHIM)
    assert pool.fill(30) == 1
    return pool.take()


def test_a_first_attempt_takes_a_spare_whole_and_makes_no_inode(tmp_path, leaves):
    task, shim_leaf = leaves
    (tmp_path / "tasks").mkdir()
    spare = one_spare(tmp_path)
    before = inodes(spare)
    run_dir = tmp_path / "tasks" / "t1" / "1"
    start_shim(run_dir, task, shim_leaf, ["true"], ENV, spare=spare)
    status = ended(run_dir)
    assert status.exit.exit_code == 0 and status.started.pid > 0
    assert not spare.exists()
    after = inodes(tmp_path / "tasks" / "t1")
    # the task's and the attempt's directories, and each record its reservation renamed
    assert after["."] == before["."] and after["1"] == before["1"]
    assert after["1/started"] == before["1/started.tmp"]
    assert after["1/exit"] == before["1/exit.tmp"]
    assert sorted(os.listdir(run_dir)) == ["exit", "started"]


@pytest.mark.parametrize("case", ["second attempt", "task directory there"])
def test_a_spare_is_left_where_it_would_not_be_the_run_directory(tmp_path, leaves, case):
    task, shim_leaf = leaves
    (tmp_path / "tasks").mkdir()
    spare = one_spare(tmp_path)
    before = inodes(spare)
    if case == "second attempt":
        run_dir = tmp_path / "tasks" / "t1" / "2"
    else:
        run_dir = tmp_path / "tasks" / "t1" / "1"
        run_dir.parent.mkdir()
    start_shim(run_dir, task, shim_leaf, ["true"], ENV, spare=spare)
    assert ended(run_dir).exit.exit_code == 0
    assert inodes(spare) == before  # untouched: the shim made its own
    assert (run_dir / "exit").stat().st_ino not in before.values()


def metric(agent: LocalAgent, name: str) -> float:
    with urllib.request.urlopen(agent.metrics_url(), timeout=10) as r:
        text = r.read().decode()
    found = [
        s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name
    ]
    assert len(found) == 1, name
    return found[0]


def wait_metric(agent: LocalAgent, name: str, want: float, timeout: float = 30.0) -> float:
    deadline = time.monotonic() + timeout
    while (got := metric(agent, name)) != want and time.monotonic() < deadline:
        time.sleep(0.1)
    return got


def test_an_agent_starts_tasks_in_spares_and_makes_the_pool_up_after(tmp_path):
    agent = LocalAgent(
        tmp_path,
        f"xhagent-spares-test-{os.getpid()}.slice",
        policies=False,
        extra=("--spare-run-dirs", "3"),
    )
    agent.start()
    try:
        assert wait_metric(agent, "xhagent_spare_run_dirs", 3) == 3
        pool = agent.state / "spare"
        made = {p.name: p.stat().st_ino for p in pool.iterdir()}
        assert len(made) == 3
        docs = "---\n".join(
            f"apiVersion: xh.scheduling/v1\nkind: Task\nmetadata: {{name: s{i}}}\n"
            'spec:\n  deviceType: cpu\n  command: ["true"]\n'
            for i in range(5)
        )
        with agent.client() as c:
            ids = [t.id for t in c.Submit(pb.SubmitRequest(source=docs, file_name="s.yaml")).tasks]
            deadline = time.monotonic() + 60
            while c.List(pb.ListRequest(states=["Pending", "Starting", "Running"])).total:
                assert time.monotonic() < deadline
                time.sleep(0.05)
            states = {t.id: t.state for t in c.List(pb.ListRequest(all=True)).tasks}
        assert all(states[i] == "Succeeded" for i in ids), states
        # three of the five started in the spares made ahead, the others in their own
        task_inodes = {(agent.state / "tasks" / i).stat().st_ino for i in ids}
        assert len(task_inodes & set(made.values())) == 3
        for i in ids:
            exit_record = json.loads((agent.state / "tasks" / i / "1" / "exit").read_text())
            assert exit_record["exit_code"] == 0
        assert metric(agent, "xhagent_spare_run_dirs_taken_total") == 3
        # the starts over, the pool is made up again
        time.sleep(QUIET_S)
        assert wait_metric(agent, "xhagent_spare_run_dirs", 3) == 3
        assert not set(os.listdir(pool)) & set(made)
    finally:
        agent.stop()
        agent.remove_subtree()
