"""The migration decision: a hot GPU sheds a migratable task onto an idle accelerator, never
onto one that a hard constraint rules out, at most one move per task and device a round."""

from dataclasses import replace

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from test_policy_placement import make_node

from xhagent.node_model import Version
from xhagent.policy.policy import Constraints, GpuConstraint, Match, Migration, Rule, Topology
from xhagent.policy.selector import Selector
from xhagent.policy.state import Allocation, Cluster, GpuShare
from xhagent.policy.task import Requests, Task
from xhagent.sched.fair import FairShare
from xhagent.sched.migration import Device, Running, decide

GiB = 2**30
L4 = ("12.4", 24, 24, 0, ())
OLD = ("11.8", 24, 24, 0, ())
POLICY = Migration()
NO_RULE = Match(None, None)


def task(name, device="gpu", migratable=True, gpu_memory=None, priority=None) -> Task:
    gpu = device == "gpu"
    requests = Requests(cpus=0, gpus=1 if gpu else None, gpu_memory=gpu_memory if gpu else None)
    return Task(name, device, requests=requests, migratable=migratable, priority=priority)


def on_gpu(t: Task, node: str, index: int) -> Allocation:
    memory = t.requests.gpu_memory
    return Allocation(t.name, node, (), 0, (GpuShare(index, memory or 0, memory is None),))


def matching(constraints: Constraints) -> Match:
    return Match(None, Rule(Selector(), constraints))


def run(devices, running, cluster, **kw):
    return decide(devices, running, cluster, POLICY, FairShare(), POLICY.interval_ns, **kw)


def seed_case(migratable=True, runs_on=frozenset({"gpu", "tpu"}), match=NO_RULE, tpu_zone=None):
    """node-a: one hot GPU running `infer`; node-b: an idle TPU chip."""
    a = make_node("node-a", gpus=(L4,))
    b = make_node("node-b", tpus=(0,), zone=tpu_zone)
    t = task("infer", migratable=migratable)
    cluster = Cluster.of([a, b], [on_gpu(t, "node-a", 0)])
    devices = [Device("node-a", "gpu", 0, 0.95), Device("node-b", "tpu", 0, 0.1)]
    return devices, [Running(t, match, "node-a/gpu0", runs_on)], cluster


def test_hot_gpu_moves_a_migratable_task_to_an_idle_tpu():
    (move,) = run(*seed_case())
    assert (move.task, move.src, move.dst) == ("infer", "node-a/gpu0", "node-b/tpu0")
    assert move.reason == "node-a/gpu0 load 0.95 > 0.85, node-b/tpu0 load 0.10 < 0.3"
    assert move.penalty_ns == FairShare().penalty(("node-a", 0), ("node-b", 0)) > 0


@pytest.mark.parametrize("migratable", [False, None])
def test_a_task_not_marked_migratable_stays(migratable):
    assert run(*seed_case(migratable=migratable)) == []


def test_a_task_that_cannot_run_on_tpu_stays():
    assert run(*seed_case(runs_on=frozenset({"gpu"}))) == []


def test_no_move_before_the_interval_or_right_after_one():
    devices, running, cluster = seed_case()
    assert decide(devices, running, cluster, POLICY, FairShare(), POLICY.interval_ns - 1) == []
    assert run(devices, running, cluster, recently_moved=frozenset({"infer"})) == []


def test_thresholds_are_strict_and_busy_devices_take_nothing():
    devices, running, cluster = seed_case()
    hot, idle = devices
    assert run([replace(hot, load=0.85), idle], running, cluster) == []
    assert run([hot, replace(idle, load=0.3)], running, cluster) == []
    assert run([hot, replace(idle, room=False)], running, cluster) == []


def test_a_tpu_in_the_wrong_zone_is_never_a_destination():
    zone = matching(Constraints(topology=Topology(zone="z1")))
    assert run(*seed_case(match=zone, tpu_zone="z2")) == []
    assert run(*seed_case(match=zone, tpu_zone=None)) == []
    # node-a has no zone either: the task's own node does not count as fitting
    (move,) = run(*seed_case(match=zone, tpu_zone="z1"))
    assert move.dst == "node-b/tpu0"


def test_gpu_to_gpu_honours_cuda_version_memory_and_prefers_the_nearest():
    a = make_node("node-a", gpus=(L4, L4, OLD))
    c = make_node("node-c", gpus=(L4,))
    t = task("train", gpu_memory=8 * GiB)
    other = task("other", gpu_memory=20 * GiB)
    cluster = Cluster.of([a, c], [on_gpu(t, "node-a", 0), on_gpu(other, "node-a", 1)])
    cuda = matching(Constraints(gpu=GpuConstraint(min_cuda_version=Version(12, 2))))
    running = [Running(t, cuda, "node-a/gpu0")]
    devices = [
        Device("node-a", "gpu", 0, 0.9),
        Device("node-a", "gpu", 1, 0.2),  # 4 GiB free: too little
        Device("node-a", "gpu", 2, 0.0),  # CUDA 11.8: too old
        Device("node-c", "gpu", 0, 0.25),
    ]
    (move,) = run(devices, running, cluster)
    assert move.dst == "node-c/gpu0"
    # without the CUDA constraint, the same node's idle GPU is nearer (no penalty)
    (move,) = run(devices, [Running(t, NO_RULE, "node-a/gpu0")], cluster)
    assert (move.dst, move.penalty_ns) == ("node-a/gpu2", 0)


def test_one_move_per_hot_device_and_per_idle_device_a_round():
    a = make_node("node-a", gpus=(("12.4", 24, 24, 0, ()), ("12.4", 24, 24, 0, ())))
    b = make_node("node-b", tpus=(0, 0))
    ts = [task(f"t{i}", gpu_memory=4 * GiB) for i in range(4)]
    cluster = Cluster.of([a, b], [on_gpu(t, "node-a", i // 2) for i, t in enumerate(ts)])
    running = [
        Running(t, NO_RULE, f"node-a/gpu{i // 2}", frozenset({"gpu", "tpu"}))
        for i, t in enumerate(ts)
    ]
    devices = [
        Device("node-a", "gpu", 0, 0.99),
        Device("node-a", "gpu", 1, 0.9),
        Device("node-b", "tpu", 0, 0.0),
        Device("node-b", "tpu", 1, 0.0),
    ]
    moves = run(devices, running, cluster)
    assert [(m.src, m.dst) for m in moves] == [
        ("node-a/gpu0", "node-b/tpu0"),
        ("node-a/gpu1", "node-b/tpu1"),
    ]
    assert len({m.task for m in moves}) == 2
    moves = run(devices[:3], running, cluster)
    assert [(m.task, m.dst) for m in moves] == [("t0", "node-b/tpu0")]


def test_idle_must_be_below_hot():
    with pytest.raises(ValueError, match="idleBelow 0.9 is not below hotAbove 0.85"):
        Migration(idle_below=0.9)


# --------------------------------------------------------------------------- property

CUDA = {"11.8": Version(11, 8), "12.4": Version(12, 4)}


@st.composite
def snapshots(draw):
    nodes, devices = [], []
    for n in range(draw(st.integers(1, 4))):
        name = f"n{n}"
        gpus = draw(
            st.lists(
                st.tuples(st.sampled_from(sorted(CUDA)), st.sampled_from([16, 24])),
                max_size=3,
            )
        )
        tpus = draw(st.integers(0, 2))
        zone = draw(st.sampled_from([None, "z1", "z2"]))
        nodes.append(
            make_node(
                name,
                gpus=tuple((c, m, m, 0, ()) for c, m in gpus),
                tpus=(0,) * tpus,
                zone=zone,
            )
        )
        for kind, count in (("gpu", len(gpus)), ("tpu", tpus)):
            devices += [
                Device(
                    name,
                    kind,
                    i,
                    draw(st.sampled_from([0.0, 0.1, 0.5, 0.9, 1.0])),
                    0,
                    draw(st.sampled_from([True, True, False])),
                )
                for i in range(count)
            ]
    cluster = Cluster.of(nodes)
    running = []
    for i, dev in enumerate(devices):
        if not draw(st.booleans()):
            continue
        st_ = cluster.nodes[dev.node]
        memory = draw(st.sampled_from([None, 4 * GiB, 12 * GiB]))
        t = replace(
            task(f"t{i}", dev.kind, draw(st.sampled_from([True, True, True, False, None])), memory),
            priority=draw(st.sampled_from([None, 10, 90])),
        )
        if dev.kind == "gpu":
            alloc = on_gpu(t, dev.node, dev.index)
        else:
            alloc = Allocation(t.name, dev.node, (), 0, tpus=(dev.index,))
        if dev.kind == "gpu" and st_.gpu(dev.index).holders:
            continue
        cluster.commit(alloc)
        constraints = Constraints(
            gpu=GpuConstraint(
                min_cuda_version=draw(st.sampled_from([None, None, Version(12, 2)])),
                min_memory_gb=draw(st.sampled_from([None, None, 20])),
            ),
            topology=Topology(zone=draw(st.sampled_from([None, None, "z1", "z2"]))),
        )
        kinds = draw(st.sets(st.sampled_from(["gpu", "tpu"]), min_size=1))
        running.append(Running(t, matching(constraints), dev.id, frozenset(kinds)))
    return devices, running, cluster


def violation(move, r: Running, cluster: Cluster, devices: dict) -> str | None:
    """What a move breaks, judged from the snapshot directly (not through placement)."""
    dst, c = devices[move.dst], r.match.constraints
    st_ = cluster.nodes[dst.node]
    if dst.kind not in r.kinds:
        return f"{r.name} cannot run on {dst.kind}"
    if c.topology.zone is not None and st_.zone != c.topology.zone:
        return f"zone {st_.zone} is not {c.topology.zone}"
    if dst.kind == "tpu":
        return "TPU chip held" if st_.tpu(dst.index).holders else None
    gpu = st_.gpu(dst.index)
    if c.gpu.min_cuda_version is not None and gpu.cuda < c.gpu.min_cuda_version:
        return f"CUDA {gpu.cuda} is older than {c.gpu.min_cuda_version}"
    need = gpu_memory(r)
    if need is not None:
        return None if not gpu.whole and gpu.free >= need else "not enough GPU memory"
    return "GPU not free" if gpu.holders else None


def gpu_memory(r: Running) -> int | None:
    """What the task holds on a GPU it moves to: its own request (a GPU task's), raised to
    the policy's minMemoryGB; None: the GPU whole."""
    own = r.task.requests.gpu_memory if r.task.device_type == "gpu" else None
    floor = r.match.constraints.gpu.min_memory_gb
    return max(own or 0, (floor or 0) * GiB) or None


@settings(max_examples=300, deadline=None)
@given(snapshots())
def test_no_move_ever_violates_a_hard_constraint(snapshot):
    devices, running, cluster = snapshot
    by_id = {d.id: d for d in devices}
    by_task = {r.name: r for r in running}
    moves = run(devices, running, cluster)
    event(f"moves: {min(len(moves), 3)}")
    assert len({m.task for m in moves}) == len(moves), "a task moved twice"
    assert len({m.dst for m in moves}) == len(moves), "a device took two tasks"
    assert len({m.src for m in moves}) == len(moves), "a device shed two tasks"
    for m in moves:
        r = by_task[m.task]
        assert r.task.migratable is True and r.device == m.src != m.dst
        assert by_id[m.src].load > POLICY.hot_above and by_id[m.dst].load < POLICY.idle_below
        assert by_id[m.dst].room
        assert violation(m, r, cluster, by_id) is None, m
    # enacting them all, one after the other, double-books nothing
    for m in moves:
        r, dst = by_task[m.task], by_id[m.dst]
        memory = gpu_memory(r)
        cluster.release(m.task)
        if dst.kind == "gpu":
            cluster.commit(
                Allocation(
                    m.task, dst.node, (), 0, (GpuShare(dst.index, memory or 0, memory is None),)
                )
            )
        else:
            cluster.commit(Allocation(m.task, dst.node, (), 0, tpus=(dst.index,)))
