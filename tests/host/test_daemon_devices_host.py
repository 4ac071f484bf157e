"""Devices handed to a workload: the agent's scheduler core with this host's node model plus
two TPU chips (this host has none; the chips exist only in the model), a real store, a real
executor over a scratch subtree and a real shim. A `deviceType: tpu` task that prints its
environment gets TPU_VISIBLE_CHIPS with the chip it was placed on, and the chip is held
while it runs and free after; a task that holds only a chip (no CPU) is a preemption victim
like any other."""

import os
import time
from dataclasses import replace

import pytest

from xhagent.cgroups.subtree import locate
from xhagent.daemon.exec.executor import Executor
from xhagent.daemon.loop.scheduler import Scheduler
from xhagent.daemon.loop.submission import parse_submission
from xhagent.daemon.store import Store
from xhagent.daemon.store.states import TERMINAL
from xhagent.inventory import build_model, discover_node
from xhagent.node_model import Accelerator

pytestmark = pytest.mark.host

# It prints its environment, then runs until the test has seen the chip held (`go` exists):
# a workload that ended at once could end within the step that started it.
TASK = """apiVersion: xh.scheduling/v1
kind: Task
metadata: {name: tpu-env}
spec:
  deviceType: tpu
  command: [sh, -c, "echo chips=$TPU_VISIBLE_CHIPS; echo cuda=${CUDA_VISIBLE_DEVICES-unset};
    while [ ! -e %s ]; do sleep 0.01; done"]
"""


@pytest.fixture
def agent(tmp_path):
    node = build_model(discover_node())
    chips = tuple(Accelerator(i, "tpu", f"accel{i}", "TPU v4") for i in range(2))
    node = replace(node, accelerators=chips)
    sub = locate(f"xhagent-devices-test-{os.getpid()}.slice")
    store = Store.open(tmp_path / "state")
    executor = Executor(sub, tmp_path / "state", 1 << 20)
    executor.prepare()
    a = Scheduler(store, executor, node, parse_submission, lambda: [])
    yield a
    store.close()
    executor.close()  # its shim server ends
    for rel in reversed(sub.walk()):
        sub.group(rel).remove(kill_first=True)
    sub.root.remove()


def test_a_tpu_task_sees_the_chip_it_holds_and_gives_it_back(agent, tmp_path):
    go = tmp_path / "go"
    (rec,) = agent.submit(TASK % go, "tpu.yaml")
    chips = agent.lifecycle.cluster.nodes[agent.node.name].tpus
    deadline = time.monotonic() + 30
    held = None
    while rec.state not in TERMINAL:
        agent.step()
        rec = agent.get(rec.id)
        if rec.placement and held is None:
            assert rec.state in ("Starting", "Running"), rec  # it waits for `go`
            held = sum(t.holders for t in chips)
            go.touch()
        assert time.monotonic() < deadline, f"still {rec.state}"
        time.sleep(0.02)
    assert rec.state == "Succeeded", rec
    assert held == 1
    chip = list(rec.placement.tpus)
    assert chip in ([0], [1])
    out = agent.executor.runs / rec.id / str(rec.attempt) / "stdout"
    assert out.read_text().split() == [f"chips={chip[0]}", "cuda=unset"]
    assert sum(t.holders for t in agent.lifecycle.cluster.nodes[agent.node.name].tpus) == 0


def tpu_task(name, priority, command):
    return f"""apiVersion: xh.scheduling/v1
kind: Task
metadata: {{name: {name}}}
spec:
  deviceType: tpu
  priority: {priority}
  requests: {{cpus: 0}}
  preemption: kill
  command: {command}
"""


def step_until(agent, task_id, states, timeout=30):
    deadline = time.monotonic() + timeout
    while (rec := agent.get(task_id)).state not in states:
        assert time.monotonic() < deadline, f"{task_id} still {rec.state}"
        agent.step()
        time.sleep(0.02)
    return rec


def test_a_task_holding_only_a_tpu_chip_is_preempted_for_a_higher_one(agent):
    """Both chips held by low tasks that hold no CPU: a higher task that wants a chip
    kills one of them (it was never a candidate while victims had to hold CPUs or GPUs)."""
    lows = [agent.submit(tpu_task(f"low{i}", 10, '[sleep, "60"]'), "low.yaml")[0] for i in (0, 1)]
    for rec in lows:
        step_until(agent, rec.id, {"Running"})
    (high,) = agent.submit(tpu_task("high", 90, "[sh, -c, 'echo chips=$TPU_VISIBLE_CHIPS']"), "h")
    high = step_until(agent, high.id, TERMINAL)
    assert high.state == "Succeeded", high
    after = [agent.get(rec.id) for rec in lows]
    assert sorted(r.preempted for r in after) == [0, 1], after
    spared = next(r for r in after if r.preempted == 0)
    assert spared.state == "Running"
    out = agent.executor.runs / high.id / str(high.attempt) / "stdout"
    assert out.read_text().split() == [f"chips={high.placement.tpus[0]}"]
    assert high.placement.tpus != spared.placement.tpus
