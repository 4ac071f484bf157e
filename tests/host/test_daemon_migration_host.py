"""Load-driven migration enacted by the daemon: the agent's scheduler core with this host's
node model plus two 16 GiB GPUs that exist only in the model (this host has none), a real
store, a real executor over a scratch subtree and real shims. Two tasks of 8 GiB each are
packed on GPU 0 (placement fills the fullest GPU that fits), which makes it hot (booked load
1.0) while GPU 1 idles: the migratable one is stopped, checkpointed and started again on
GPU 1, where its environment says CUDA_VISIBLE_DEVICES is GPU 1; the other never moves. A
kill -9 of the agent during the checkpoint is completed by the next agent's recovery."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import pytest

from xhagent.cgroups.subtree import locate
from xhagent.daemon.exec.executor import Executor
from xhagent.daemon.loop import migration as migrating
from xhagent.daemon.loop.lifecycle import allocation_of
from xhagent.daemon.loop.scheduler import Scheduler
from xhagent.daemon.loop.submission import parse_submission
from xhagent.daemon.policies.sources import parse_source
from xhagent.daemon.store import Store
from xhagent.inventory import build_model, discover_node
from xhagent.node_model import Accelerator, Bytes, Gpu, Version

pytestmark = pytest.mark.host

GIB = 1 << 30
V12, V9 = Version(12, 4), Version(9, 0)
POLICY = """apiVersion: xh.scheduling/v1
kind: SchedulingPolicy
metadata: {name: move-hot-gpus}
spec:
  matchRules:
    - selector: {matchLabels: {app: infer}}
  migration: {interval: 100ms, hotAbove: 0.85, idleBelow: 0.3}
"""


def gpu_task(
    name: str, migratable: bool, checkpoint: list[str] | None = None, timeout: str = "5s"
) -> str:
    extra = "  migratable: true\n" if migratable else ""
    if checkpoint is not None:
        extra += f"  checkpoint: {{command: {checkpoint!r}, timeout: {timeout}}}\n"
    return (
        f"apiVersion: xh.scheduling/v1\nkind: Task\nmetadata: {{name: {name}}}\nspec:\n"
        "  deviceType: gpu\n  requests: {gpus: 1, gpuMemory: 8GiB}\n" + extra + "  command: "
        "[sh, -c, 'echo cuda=$CUDA_VISIBLE_DEVICES; exec sleep 120']\n"
    )


def model(gpus: int = 2):
    """This host's node model plus `gpus` 16 GiB GPUs that only the model has."""
    node = build_model(discover_node())
    made = tuple(
        Gpu(i, f"GPU-model-{i}", "Model GPU", Bytes(16 * GIB), Bytes(16 * GIB), V12, V9)
        for i in range(gpus)
    )
    return replace(node, gpus=made)


def policies():
    return [parse_source(POLICY, "policy.yaml")[0].value]


def make_agent(state, sub, node) -> Scheduler:
    executor = Executor(sub, state, 1 << 20)
    executor.prepare()
    return Scheduler(Store.open(state), executor, node, parse_submission, policies)


@pytest.fixture
def setup(tmp_path):
    name = f"xhagent-migration-test-{os.getpid()}-{tmp_path.name[-10:]}.slice"
    sub = locate(name)
    made = []

    def new(node=None) -> Scheduler:
        a = make_agent(tmp_path / "state", sub, node or model())
        made.append(a)
        return a

    yield new, name, tmp_path
    for a in made:
        a.store.close()
        a.executor.close()  # its shim server ends
    for rel in reversed(sub.walk()):
        sub.group(rel).remove(kill_first=True)
    sub.root.remove()


def step_until(agent: Scheduler, done, timeout=20.0, what=""):
    deadline = time.monotonic() + timeout
    while not done():
        agent.step()
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def two(hook: list[str], timeout: str = "5s") -> str:
    """A migratable task with `hook` as its checkpoint, then one that is not."""
    return gpu_task("mover", True, hook, timeout) + "---\n" + gpu_task("pinned", False)


def running(agent: Scheduler, *recs):
    return lambda: all(agent.get(r.id).state == "Running" for r in recs)


def stdout(agent: Scheduler, rec) -> list[str]:
    path = agent.executor.runs / rec.id / str(rec.attempt) / "stdout"
    deadline = time.monotonic() + 5
    while not path.exists() or not path.read_text():
        assert time.monotonic() < deadline, f"no output from {rec.id} attempt {rec.attempt}"
        time.sleep(0.02)
    return path.read_text().split()


def gpu_of(rec) -> int:
    (share,) = rec.placement.gpus
    return share.index


def events(agent: Scheduler, task_id: str, kind: str):
    return [e for e in agent.store.events(task_id=task_id) if e.kind == kind]


def assert_holdings_match(agent: Scheduler, *recs):
    st = agent.lifecycle.cluster.nodes[agent.node.name]
    for rec in recs:
        assert st.tasks[rec.id] == allocation_of(rec)
    holders = {g.index: g.holders for g in st.gpus}
    reserved = {g.index: g.reserved for g in st.gpus}
    want_holders = {g.index: 0 for g in st.gpus}
    for rec in recs:
        want_holders[gpu_of(rec)] += 1
    assert holders == want_holders
    assert reserved == {i: n * 8 * GIB for i, n in want_holders.items()}


def test_a_migratable_task_on_a_hot_gpu_moves_to_the_idle_one_with_its_new_env(setup):
    new, _, tmp = setup
    agent = new()
    ckpt = tmp / "ckpt"
    said = "$XHAGENT_MIGRATE_FROM $XHAGENT_MIGRATE_TO $CUDA_VISIBLE_DEVICES"
    hook = ["sh", "-c", f'echo "{said}" > {ckpt}']
    mover, pinned = agent.submit(two(hook), "t.yaml")
    step_until(agent, running(agent, mover, pinned), what="both running")
    first = agent.get(mover.id)
    assert (gpu_of(first), gpu_of(agent.get(pinned.id))) == (0, 0)  # packed: GPU 0 is hot
    assert stdout(agent, first) == ["cuda=GPU-model-0"]
    old_shim = agent.lifecycle.shim_pid(mover.id)

    step_until(agent, lambda: events(agent, mover.id, "Migrated"), what="the move")
    moved, stay = agent.get(mover.id), agent.get(pinned.id)
    node = agent.node.name
    assert moved.state == "Running" and gpu_of(moved) == 1 and moved.attempt == 2
    assert moved.migrated == 1 and moved.placement.gpu_uuids == ["GPU-model-1"]
    assert stdout(agent, moved) == ["cuda=GPU-model-1"]
    assert ckpt.read_text().split() == [f"{node}/gpu0", f"{node}/gpu1", "GPU-model-0"]
    (event,) = events(agent, mover.id, "Migrated")
    assert event.message == (
        f"moved from {node}/gpu0 to {node}/gpu1: {node}/gpu0 load 1.00 > 0.85, "
        f"{node}/gpu1 load 0.00 < 0.3"
    )
    assert "NVIDIA driver" in event.detail["load_note"] or "NVML" in event.detail["load_note"]
    assert event.detail == {  # the shape the README shows
        "from": f"{node}/gpu0",
        "to": f"{node}/gpu1",
        "reason": f"{node}/gpu0 load 1.00 > 0.85, {node}/gpu1 load 0.00 < 0.3",
        "hot_load": 1.0,
        "target_load": 0.0,
        "load_source": "booked",
        "load_note": event.detail["load_note"],
        "penalty_ns": 0.0,
        "attempt": 2,
        "checkpoint": "ok",
    }
    # the old workload is gone, its allocation given back once, the new one held once
    with pytest.raises(ProcessLookupError):
        os.kill(old_shim, 0)
    assert stay.state == "Running" and gpu_of(stay) == 0 and stay.attempt == 1
    assert_holdings_match(agent, moved, stay)
    assert sorted(agent.executor.leaves()) == sorted([mover.id, pinned.id])
    assert all(i.done_ns for i in agent.store.open_intents()) and not agent.store.open_intents()
    # settled: GPU 0 at 0.5 is not hot, nothing moves back or again
    until = time.monotonic() + 0.5
    while time.monotonic() < until:
        agent.step()
        time.sleep(0.05)
    assert len(events(agent, mover.id, "Migrated")) == 1 and agent.get(mover.id).attempt == 2


def test_a_task_that_is_not_migratable_never_moves(setup, monkeypatch):
    new, _, _ = setup
    agent = new(model(gpus=3))
    decided = []

    def decide(*args, **kw):
        decided.append(migrating.migration.decide.__wrapped__(*args, **kw))
        return decided[-1]

    decide.__wrapped__ = migrating.migration.decide
    monkeypatch.setattr(migrating.migration, "decide", decide)
    # a and b fill GPU 0 (hot), c (migratable) half of GPU 1, GPU 2 idles
    source = "---\n".join([gpu_task("a", False), gpu_task("b", False), gpu_task("c", True)])
    a, b, c = agent.submit(source, "t.yaml")
    step_until(agent, running(agent, a, b, c), what="all running")
    assert [gpu_of(agent.get(r.id)) for r in (a, b, c)] == [0, 0, 1]
    until = time.monotonic() + 1.0  # ten intervals
    while time.monotonic() < until:
        agent.step()
        time.sleep(0.05)
    assert len(decided) >= 5 and not any(decided)  # the controller looked, and moved nothing
    for rec in (a, b, c):
        rec = agent.get(rec.id)
        assert (rec.state, rec.attempt, rec.migrated) == ("Running", 1, 0)
        assert not [e for e in agent.store.events(task_id=rec.id) if "Migrat" in e.kind]
    assert_holdings_match(agent, *(agent.get(r.id) for r in (a, b, c)))


XPU_TASK = """apiVersion: xh.scheduling/v1
kind: Task
metadata: {name: xpu}
spec:
  deviceType: gpu
  requests: {gpus: 1}
  migratable: true
  runsOn: [gpu, tpu]
  command: [sh, -c, 'echo cuda=${CUDA_VISIBLE_DEVICES-unset} chips=${TPU_VISIBLE_CHIPS-unset};
    exec sleep 120']
"""


def test_a_task_that_runs_on_tpus_too_moves_from_a_hot_gpu_to_an_idle_chip(setup):
    """The seed's case: a GPU held whole (booked load 1.0) by a task alone on it, an idle TPU
    chip, the task's runsOn [gpu, tpu]: it moves to the chip and sees TPU_VISIBLE_CHIPS, no
    CUDA_VISIBLE_DEVICES; it does not go back to the GPU it left."""
    new, _, _ = setup
    node = model(gpus=1)
    node = replace(node, accelerators=(Accelerator(0, "tpu", "accel0", "TPU v4"),))
    agent = new(node)
    (rec,) = agent.submit(XPU_TASK, "t.yaml")
    step_until(agent, running(agent, rec), what="running")
    first = agent.get(rec.id)
    assert first.placement.gpus[0].whole is True and first.placement.tpus == ()
    assert stdout(agent, first) == ["cuda=GPU-model-0", "chips=unset"]
    step_until(agent, lambda: events(agent, rec.id, "Migrated"), what="the move")
    moved = agent.get(rec.id)
    assert moved.placement.tpus == (0,) and moved.placement.gpus == ()
    assert stdout(agent, moved) == ["cuda=unset", "chips=0"]
    (event,) = events(agent, rec.id, "Migrated")
    n = agent.node.name
    assert (event.detail["from"], event.detail["to"]) == (f"{n}/gpu0", f"{n}/tpu0")
    st = agent.lifecycle.cluster.nodes[n]
    assert st.tasks[rec.id] == allocation_of(moved)
    assert (st.gpu(0).holders, st.gpu(0).whole, st.tpu(0).holders) == (0, False, 1)
    until = time.monotonic() + 0.5  # the chip is now "hot", the GPU idle: it stays
    while time.monotonic() < until:
        agent.step()
        time.sleep(0.05)
    assert len(events(agent, rec.id, "Migrated")) == 1 and agent.get(rec.id).attempt == 2


@pytest.mark.parametrize(
    ("hook", "timeout", "error"),
    [
        (
            ["sh", "-c", "echo disk full >&2; exit 3"],
            "5s",
            "checkpoint failed with exit code 3: disk full",
        ),
        (
            ["sh", "-c", "echo saving; sleep 30 & wait"],
            "300ms",
            "checkpoint timed out after 0.3s: saving",
        ),
    ],
)
def test_a_failing_checkpoint_starts_the_task_again_where_it_was(setup, hook, timeout, error):
    new, _, _ = setup
    agent = new()
    mover, pinned = agent.submit(two(hook, timeout), "t.yaml")
    step_until(agent, lambda: events(agent, mover.id, "MigrationAborted"), what="the abort")
    rec = agent.get(mover.id)
    assert rec.state == "Running" and gpu_of(rec) == 0 and rec.attempt == 2
    assert stdout(agent, rec) == ["cuda=GPU-model-0"]
    (event,) = events(agent, mover.id, "MigrationAborted")
    assert event.detail["checkpoint"] == "failed" and event.detail["error"] == error
    assert event.message.startswith(f"not moved to {agent.node.name}/gpu1, started again on ")
    assert not events(agent, mover.id, "Migrated")
    assert_holdings_match(agent, rec, agent.get(pinned.id))
    # a hook that timed out is killed with everything it started (its leaf)
    left = subprocess.run(["pgrep", "-f", "^sleep 30$"], capture_output=True, text=True)
    assert left.stdout.split() == []
    # not stopped again: five intervals on, GPU 0 still hot, the task runs the same attempt
    until = time.monotonic() + 0.5
    while time.monotonic() < until:
        agent.step()
        time.sleep(0.05)
    assert agent.get(mover.id).attempt == 2
    assert len(events(agent, mover.id, "MigrationAborted")) == 1


QUICK = """apiVersion: xh.scheduling/v1
kind: Task
metadata: {name: quick}
spec:
  deviceType: cpu
  command: [sh, -c, 'echo hi']
"""


def test_the_loop_goes_on_while_a_checkpoint_runs(setup):
    """A 3 s checkpoint, in the task's own leaf: meanwhile the mover waits in Pending
    (reason Migrating) where the scheduler leaves it, and a task submitted then runs and
    ends; the move completes after."""
    new, _, tmp = setup
    agent = new()
    done = tmp / "ckpt-done"
    hook = ["sh", "-c", f"sleep 3; grep ^0:: /proc/self/cgroup > {done}"]
    mover, pinned = agent.submit(two(hook), "t.yaml")
    step_until(agent, lambda: migrating_now(agent, mover), what="the checkpoint to start")
    started = time.monotonic()
    (quick,) = agent.submit(QUICK, "quick.yaml")
    step_until(agent, lambda: agent.get(quick.id).state == "Succeeded", what="the quick task")
    assert not done.exists() and time.monotonic() - started < 3  # within the hook's run
    rec = agent.get(mover.id)
    assert migrating_now(agent, mover) and rec.attempt == 1 and rec.placement is None
    step_until(agent, lambda: events(agent, mover.id, "Migrated"), what="the move")
    moved = agent.get(mover.id)
    assert done.exists() and moved.state == "Running" and gpu_of(moved) == 1
    # the hook ran in the task's own leaf (made again for it), not in the agent's group
    sub = agent.executor.sub.root.path.name
    assert done.read_text().strip().endswith(f"/{sub}/tasks/{mover.id}"), done.read_text()
    assert_holdings_match(agent, moved, agent.get(pinned.id))
    assert not agent.store.open_intents() and not agent.migration.hooks


def migrating_now(agent: Scheduler, rec) -> bool:
    cur = agent.get(rec.id)
    kinds = [r.kind for r in cur.reasons]
    return (
        cur.state == "Pending" and kinds == [migrating.MIGRATING] and agent.migration.busy(rec.id)
    )


CRASHING_AGENT = textwrap.dedent(
    """
    import os, signal, sys, time
    sys.path.insert(0, {tests!r})
    from test_daemon_migration_host import make_agent, model
    from pathlib import Path
    from xhagent.cgroups.subtree import locate
    Path({pidfile!r}).write_text(str(os.getpid()))  # for the hook that kills it
    agent = make_agent(Path({state!r}), locate({sub!r}), model())
    if {before_stop!r}:  # the intent is committed, the workload not yet stopped
        agent.executor.kill = lambda *a, **kw: os.kill(os.getpid(), signal.SIGKILL)
    agent.submit({source!r}, "t.yaml")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # killed mid-move before this ends
        agent.step()
        time.sleep(0.02)
    sys.exit(3)
    """
)


@pytest.mark.parametrize("point", ["before-stop", "in-checkpoint"])
def test_an_agent_killed_mid_move_is_completed_by_the_next_ones_recovery(setup, point):
    """A real kill -9 of an agent process (run by this test) at one point of a move: after
    the intent is committed and before the stop, or in the checkpoint (after the stop, before
    the restart: the hook's first run SIGKILLs the agent)."""
    new, sub, tmp = setup
    marker, ckpt, pidfile = tmp / "killed-once", tmp / "ckpt", tmp / "agent.pid"
    kill = "" if point == "before-stop" else f"kill -9 $(cat {pidfile}); sleep 5;"
    hook = ["sh", "-c", f"echo $XHAGENT_MIGRATE_TO >> {ckpt}; [ -e {marker} ] || "
            f"{{ touch {marker}; {kill} }}"]  # fmt: skip
    script = CRASHING_AGENT.format(
        tests=os.path.dirname(__file__),
        state=str(tmp / "state"),
        sub=sub,
        source=two(hook),
        before_stop=point == "before-stop",
        pidfile=str(pidfile),
    )
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert res.returncode == -signal.SIGKILL, res.stderr[-3000:]

    agent = new()
    (intent,) = agent.store.open_intents()  # the move, begun and not finished
    assert intent.action == "migrate"
    mover_id = intent.task_id
    cut = agent.get(mover_id)
    if point == "before-stop":
        assert (cut.state, cut.attempt, cut.migrated) == ("Running", 1, 0)
        assert agent.executor.status(mover_id, 1).exit is None  # its workload still runs
        assert not ckpt.exists()
    else:
        assert (cut.state, cut.attempt, cut.migrated) == ("Pending", 1, 1)
    counts = agent.recover()
    assert counts["moved"] == 1 and counts["adopted"] == 1, counts
    assert not agent.store.open_intents()
    recs = {r.name: r for r in agent.store.list_tasks()}
    moved, stay = recs["mover"], recs["pinned"]
    assert moved.id == mover_id and moved.state == "Running" and gpu_of(moved) == 1
    assert (moved.attempt, moved.migrated) == (2, 1)
    assert stdout(agent, moved) == ["cuda=GPU-model-1"]
    assert stay.state == "Running" and gpu_of(stay) == 0 and stay.attempt == 1
    assert_holdings_match(agent, moved, stay)
    node = agent.node.name
    runs = 1 if point == "before-stop" else 2  # cut in the hook: run, cut, run again
    assert ckpt.read_text().split() == [f"{node}/gpu1"] * runs
    (event,) = events(agent, moved.id, "Migrated")
    assert event.detail["recovered"] is True and event.detail["to"] == f"{node}/gpu1"
    # one workload per task: the first attempt was killed, each leaf holds one process
    assert agent.executor.status(moved.id, 1).exit.signal == signal.SIGKILL
    assert sorted(agent.executor.leaves()) == sorted([moved.id, stay.id])
    for rec in (moved, stay):
        procs = agent.executor.leaf(rec.id).read("cgroup.procs").split()
        assert len(procs) == 1, (rec.name, procs)
        assert Path(f"/proc/{procs[0]}/cmdline").read_bytes() == b"sleep\x00120\x00"
    step_until(agent, lambda: True)
    assert agent.get(moved.id).state == "Running" and agent.get(moved.id).attempt == 2
