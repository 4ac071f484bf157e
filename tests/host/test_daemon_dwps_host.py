"""DWPS on a real kernel, with GPU memory stood in: the agent's scheduler core with this
host's node model plus one 16 GiB GPU (this host has none; the GPU exists only in the
model), a real store, a real executor over a scratch subtree and real shims, and pynvml's
stand-in reporting what a real workload process uses (found in its task by its real cgroup).

Asserted: eight 2 GiB shares fill the GPU's line; with three of them ended, a 4 GiB request
due first finds 6 GiB free in three blocks and evicts the task whose leaving opens a 4 GiB
block (its workload killed in its leaf, the task requeued), then runs there; a workload
that NVML says uses more than its reservation moves on the line to a block that holds it.
"""

import os
import time
from dataclasses import replace
from pathlib import Path

import pytest

from xhagent.daemon.policies.sources import parse_source
from xhagent.daemon.store import TaskState
from xhagent.inventory import build_model, discover_node
from xhagent.node_model import Bytes, Gpu, Version

pytestmark = pytest.mark.host

GIB = 1 << 30
EXAMPLE = Path(__file__).resolve().parents[2] / "configs/examples/queueing-dwps.yaml"


def task(name: str, memory: str, deadline: str) -> str:
    return f"""apiVersion: xh.scheduling/v1
kind: Task
metadata: {{name: {name}, labels: {{gpu: shared}}}}
spec:
  deviceType: gpu
  command: [sleep, "600"]
  requests: {{gpus: 1, gpuMemory: {memory}}}
  deadline: {deadline}
"""


@pytest.fixture
def agent(tmp_path, standin_nvml, scratch_scheduler):
    gpu = Gpu(
        0, "GPU-0", "Model GPU", Bytes(16 * GIB), Bytes(16 * GIB), Version(12, 4), Version(9, 0)
    )
    node = replace(build_model(discover_node()), gpus=(gpu,))
    policy = parse_source(EXAMPLE.read_text(), str(EXAMPLE))[0].value
    with scratch_scheduler(tmp_path, node, [policy], f"xhagent-dwps-test-{os.getpid()}.slice") as a:
        a.gpu_memory.nvml = standin_nvml[1]
        yield a


def settle(agent, until, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not until():
        assert time.monotonic() < deadline, what
        agent.step()
        time.sleep(0.02)


def line(agent) -> list[tuple[str, float, float]]:
    memory = agent.gpu_memory.lines[0].memory
    return [(a.owner, a.start / GIB, a.size / GIB) for a in memory.allocations]


def test_a_scattered_gpu_evicts_a_real_workload_and_nvml_use_moves_one(agent, standin_nvml):
    names = "abcdefgh"
    recs = agent.submit("---\n".join(task(n, "2GiB", "1h") for n in names), "t.yaml")
    ids = dict(zip(names, (r.id for r in recs), strict=True))

    def running(*ns: str) -> bool:
        return all(agent.get(ids[n]).state == TaskState.RUNNING for n in ns)

    settle(agent, lambda: running(*names), "the eight did not all start")
    for n in "ace":
        agent.executor.kill(ids[n])
    settle(
        agent, lambda: all(agent.get(ids[n]).state != TaskState.RUNNING for n in "ace"), "a, c, e"
    )
    b, d, f = ids["b"], ids["d"], ids["f"]
    assert [(o, s) for o, s, _ in line(agent)] == [
        (b, 2),
        (d, 6),
        (f, 10),
        (ids["g"], 12),
        (ids["h"], 14),
    ]
    f_pid = agent.executor.status(f, 1).started.pid

    (urgent,) = (r.id for r in agent.submit(task("urgent", "4GiB", "1m"), "u.yaml"))
    settle(agent, lambda: agent.get(urgent).state == TaskState.RUNNING, "urgent did not start")
    assert (urgent, 8, 4) in line(agent)
    assert agent.get(f).preempted == 1  # requeued, not ended
    assert not os.path.exists(f"/proc/{f_pid}")  # its workload was killed in its leaf
    (event,) = [e for e in agent.store.events(0, task_id=urgent) if e.kind == "GpuCompacted"]
    assert event.detail["evicted"] == f
    settle(agent, lambda: agent.get(f).state == TaskState.RUNNING, "f did not start again")
    assert (f, 0, 2) in line(agent)  # in the first block that holds it

    # d's workload uses 3 GiB by NVML: more than its 2 GiB, more than the bytes after it
    d_pid = agent.executor.status(d, 1).started.pid
    assert (
        agent.executor.task_of_pid(d_pid) == d and agent.executor.task_of_pid(os.getpid()) is None
    )
    standin_nvml[0].processes = [(d_pid, 3 * GIB), (os.getpid(), 5 * GIB)]
    agent.gpu_memory.sample()
    agent.step()
    assert (d, 4, 3) in line(agent)  # moved to c's block and its own old one
