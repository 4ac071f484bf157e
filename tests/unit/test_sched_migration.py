"""The migration decision: a hot GPU sheds a migratable task onto an idle accelerator, never
onto one that a hard constraint rules out, at most one move per task and device a round."""

import json
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import event, given, settings
from hypothesis import strategies as st
from test_policy_placement import make_node

from xhagent.node_model import Version
from xhagent.policy.policy import (
    Constraints,
    GpuConstraint,
    Match,
    Migration,
    Rule,
    SchedulingPolicy,
    Topology,
)
from xhagent.policy.selector import Selector
from xhagent.policy.state import Allocation, Cluster, GpuShare
from xhagent.policy.task import Requests, Task
from xhagent.sched.fair import FairShare
from xhagent.sched.job import Job
from xhagent.sched.migration import Device, Running, decide
from xhagent.sched.simulate import simulate_command
from xhagent.sched.simulator import NodeSpec, Simulation
from xhagent.sched.workload import load_workload_text
from xhagent.spec import SpecError

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
    assert run(devices, running, cluster, left={"infer": {"node-b/tpu0"}}) == []


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
    peer = task("peer", migratable=False, gpu_memory=8 * GiB)
    allocations = [on_gpu(t, "node-a", 0), on_gpu(other, "node-a", 1), on_gpu(peer, "node-a", 0)]
    cluster = Cluster.of([a, c], allocations)
    cuda = matching(Constraints(gpu=GpuConstraint(min_cuda_version=Version(12, 2))))
    running = [Running(t, cuda, "node-a/gpu0"), Running(peer, NO_RULE, "node-a/gpu0")]
    devices = [
        Device("node-a", "gpu", 0, 0.9),
        Device("node-a", "gpu", 1, 0.2),  # 4 GiB free: too little
        Device("node-a", "gpu", 2, 0.0),  # CUDA 11.8: too old
        Device("node-c", "gpu", 0, 0.25),
    ]
    (move,) = run(devices, running, cluster)
    assert move.dst == "node-c/gpu0"
    # without the CUDA constraint, the same node's idle GPU is nearer (no penalty)
    (move,) = run(devices, [Running(t, NO_RULE, "node-a/gpu0"), running[1]], cluster)
    assert (move.dst, move.penalty_ns) == ("node-a/gpu2", 0)
    # alone on its GPU, it would only carry the heat to another GPU: it stays
    assert run(devices, [Running(t, NO_RULE, "node-a/gpu0")], cluster) == []


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


# --------------------------------------------------------------------------- simulated

EXAMPLES = Path(__file__).resolve().parents[2] / "configs" / "examples"
S = 10**9


def hot_gpu_jobs(migratable=True, affinity=None):
    """A 20 s migratable job on the only GPU, then a GPU request a second for 20 s."""
    runs_on = frozenset({"gpu", "tpu"})
    long = Job(
        "long",
        0,
        20 * S,
        60 * S,
        device="gpu",
        migratable=migratable,
        runs_on=runs_on,
        affinity=affinity or {},
    )
    reqs = [
        Job(f"r{i}", (i + 1) * S, S // 10, (i + 1) * S + 2 * S, device="gpu") for i in range(20)
    ]
    return [long, *reqs]


NODES = [NodeSpec("g", cpus=1, gpus=1), NodeSpec("t", cpus=1, tpus=1)]


def test_the_simulator_moves_the_long_job_to_the_tpu_and_the_requests_meet_their_deadlines():
    policy = Migration(checkpoint_ns=S // 5)
    out = Simulation(hot_gpu_jobs(), NODES, "fifo", migration=policy).run()
    ((at, move),) = out.moves
    assert (at, move.task, move.src, move.dst) == (5 * S, "long", "g/gpu0", "t/tpu0")
    long = out.records[0]
    # it ran 5 s on the GPU, stopped for the checkpoint, and finished on the TPU
    assert long.finish_ns == 20 * S + S // 5 and long.migrations == 1
    assert [i for i in out.intervals if i[1] == "long"] == [
        ("g/gpu0", "long", 0, 5 * S),
        ("t/tpu0", "long", 5 * S, 20 * S + S // 5),
    ]
    without = Simulation(hot_gpu_jobs(), NODES, "fifo").run()
    missed = sum(r.missed for r in out.records), sum(r.missed for r in without.records)
    assert missed[0] < missed[1] and without.moves == [] and without.migrations == 0


def test_the_simulator_never_moves_what_is_not_migratable_or_what_a_rule_forbids():
    assert Simulation(hot_gpu_jobs(False), NODES, "fifo", migration=Migration()).run().moves == []
    # plain nodes have no zone label: a rule that asks for one admits no TPU
    zone = SchedulingPolicy(
        "zoned",
        (Rule(Selector((("app", "x"),)), Constraints(topology=Topology(zone="z1"))),),
        migration=Migration(),
    )
    jobs = hot_gpu_jobs(affinity={"app": "x"})
    out = Simulation(jobs, NODES, "fifo", migration=zone.migration, policies=(zone,)).run()
    assert out.moves == []
    other = hot_gpu_jobs(affinity={"app": "y"})  # the rule does not match it
    assert Simulation(other, NODES, "fifo", migration=zone.migration, policies=(zone,)).run().moves


def example_args(policy) -> list[str]:
    """simulate's arguments for the hot-GPU example under `policy`."""
    workload, nodes = EXAMPLES / "migration-hot-gpu.yaml", EXAMPLES / "migration-nodes.yaml"
    return ["--workload", str(workload), "--nodes", str(nodes), "--policy", str(policy)]


def test_simulate_reports_moves_and_their_effect_on_deadlines():
    args = [*example_args(EXAMPLES / "migration-policy.yaml"), "--algorithm", "fifo", "--json"]
    res = CliRunner().invoke(simulate_command, args)
    assert res.exit_code == 0, res.output
    m = json.loads(res.output)["migration"]
    assert (m["interval_ms"], m["hot_above"], m["idle_below"]) == (5000, 0.85, 0.3)
    kinds = [(mv["src"].split("/")[1][:3], mv["dst"].split("/")[1][:3]) for mv in m["moves"]]
    assert kinds.count(("gpu", "tpu")) >= 10
    assert all(a != b for a, b in kinds), "each batch runs alone: it only ever changes type"
    assert all(" > 0.85, " in mv["reason"] and mv["task"].startswith("batch") for mv in m["moves"])
    assert m["missed"] < m["without"]["missed"]
    assert m["deadline_miss_ratio"] < m["without"]["deadline_miss_ratio"]
    assert not m["without"]["classes"]["request"]["meets_sla"]


def test_simulate_refuses_a_bad_policy_with_its_location(tmp_path):
    bad = tmp_path / "p.yaml"
    bad.write_text((EXAMPLES / "migration-policy.yaml").read_text().replace("0.85", "1.85"))
    args = example_args(bad)
    res = CliRunner().invoke(simulate_command, args)
    assert res.exit_code == 2
    assert f"{bad}:14:15: spec.migration.hotAbove: 1.85 is out of range 0..1" in res.output


@pytest.mark.parametrize(
    "fields,message",
    [
        ("runsOn: [tpu]", "spec.classes.0.runsOn: lists tpu, not the deviceType gpu"),
        ("runsOn: [fpga]", "spec.classes.0.runsOn.0: 'fpga' is not one of cpu, gpu, tpu"),
        ("migratable: maybe", "spec.classes.0.migratable: expected true or false"),
    ],
)
def test_workload_migration_fields_are_checked(fields, message):
    text = (
        "kind: Workload\nspec:\n  classes:\n"
        f"    - {{name: a, deviceType: gpu, rate: 1, {fields}}}\n"
    )
    with pytest.raises(SpecError) as info:
        load_workload_text(text, "w.yaml")
    assert message in str(info.value)


def test_an_inventory_node_gives_the_simulator_its_tpu_chips_on_their_numa_nodes():
    from xhagent.sched.nodes import from_inventory
    from xhagent.sched.slots import slots_of

    node = make_node(numa=((2,), (2,)), smt=1, tpus=(1, 0, 1))
    spec = from_inventory(node)
    assert (spec.cpus, spec.tpus, spec.tpu_numa) == (4, 3, (1, 0, 1))
    tpu = sorted((s.unit, s.numa) for s in slots_of([spec]) if s.device == "tpu")
    assert tpu == [("n1/tpu0", 1), ("n1/tpu1", 0), ("n1/tpu2", 1)]
