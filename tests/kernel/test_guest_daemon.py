"""`xhagent run` where every controller exists (the guest): the task leaf holds the task's
CPUs, its memory.max (an OOM-kill is reported as such) and its class's weights, and nothing
is listed as not enforced."""

import json
import os
import sys
import time
import uuid

import pytest

from xhagent.bench.local_agent import LocalAgent
from xhagent.daemon.api.v1 import agent_pb2 as pb

pytestmark = pytest.mark.kernel
CONTROLLERS = ["cpu", "cpuset", "io", "memory", "pids"]


@pytest.fixture
def agent(cgroup_root, tmp_path):
    control = cgroup_root / "cgroup.subtree_control"
    added = [c for c in CONTROLLERS if c not in control.read_text().split()]
    control.write_text(" ".join(f"+{c}" for c in added))
    a = LocalAgent(tmp_path, f"xhagent-guest-{uuid.uuid4().hex[:8]}.slice")
    a.start(timeout=120)
    try:
        yield a
    finally:
        a.stop()
        a.remove_subtree()
        if added:
            control.write_text(" ".join(f"-{c}" for c in added))


def submit(agent, name: str, command: list[str], spec: str = "") -> str:
    source = (
        f"apiVersion: xh.scheduling/v1\nkind: Task\nmetadata: {{name: {name}}}\n"
        f"spec:\n  deviceType: cpu\n  command: {json.dumps(command)}\n{spec}"
    )
    with agent.client() as c:
        return c.Submit(pb.SubmitRequest(source=source, file_name=f"{name}.yaml")).tasks[0].id


def wait(agent, task_id: str, states=("Succeeded", "Failed", "Cancelled"), timeout=60.0):
    deadline = time.monotonic() + timeout
    with agent.client() as c:
        while True:
            task = c.Get(pb.GetRequest(id=task_id)).task
            if task.state in states or time.monotonic() > deadline:
                return task
            time.sleep(0.05)


def output(agent, task_id: str) -> str:
    with agent.client() as c:
        chunks = c.Logs(pb.LogsRequest(id=task_id, stream=pb.LOG_STREAM_STDOUT))
        return b"".join(ch.data for ch in chunks).decode()


def test_a_task_runs_on_its_cpus_with_its_class_weights(agent):
    tid = submit(
        agent,
        "pinned",
        ["sh", "-c", "grep Cpus_allowed_list /proc/self/status; sleep 1"],
        "  requests: {cpus: 1, memory: 64Mi}\n  class: latency\n",
    )
    running = wait(agent, tid, ("Running",))
    assert running.state == "Running" and len(running.cpus) == 1
    assert list(running.unenforced) == []  # every limit is enforced here
    leaf = agent.subtree_path / "tasks" / tid
    assert (leaf / "cpuset.cpus").read_text().strip() == str(running.cpus[0])
    assert (leaf / "cpu.weight").read_text().strip() == "1000"
    assert "default 1000" in (leaf / "io.weight").read_text()
    assert (leaf / "memory.max").read_text().strip() == str(64 << 20)
    done = wait(agent, tid)
    assert done.state == "Succeeded"
    assert output(agent, tid).split() == ["Cpus_allowed_list:", str(running.cpus[0])]


def test_a_task_over_its_memory_request_is_reported_oom_killed(agent):
    grab = "b = bytearray(256 << 20); b[::4096] = b'x' * len(b[::4096])"
    tid = submit(agent, "hog", [sys.executable, "-c", grab], "  requests: {memory: 32Mi}\n")
    done = wait(agent, tid, timeout=120)
    assert done.state == "Failed" and done.signal == 9, done
    assert done.error.startswith("OOMKilled"), done.error


def test_a_latency_task_freezes_a_batch_task_holding_the_cpus(agent):
    count = len(os.sched_getaffinity(0))  # the batch task takes every CPU
    batch = submit(
        agent,
        "batch",
        ["sh", "-c", "sleep 3; echo batch-done"],
        f"  requests: {{cpus: {count}}}\n  priority: 10\n  class: batch\n",
    )
    assert wait(agent, batch, ("Running",)).state == "Running"
    latency = submit(
        agent,
        "latency",
        ["grep", "Cpus_allowed_list", "/proc/self/status"],
        "  requests: {cpus: 1}\n  priority: 90\n  class: latency\n",
    )
    done = wait(agent, latency)
    assert done.state == "Succeeded"
    assert output(agent, latency).split() == ["Cpus_allowed_list:", str(done.cpus[0])]
    with agent.client() as c:
        events = list(c.Watch(pb.WatchRequest(since_seq=0, task_id=batch)))
    messages = [e.message for e in events]
    assert f"Running -> Frozen: preempted by {latency}" in messages, messages
    assert wait(agent, batch).state == "Succeeded"
    assert output(agent, batch) == "batch-done\n"
