"""Placement: every Pending reason word for word, the seed example, and properties that hold
for any cluster: no hard constraint is ever violated, and an unplaced task has a reason
on every node."""

import json
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import event, given, settings
from hypothesis import strategies as st

from xhagent.node_model import Node, Version, load_nodes
from xhagent.policy.cli import policy as policy_cli
from xhagent.policy.documents import load_items
from xhagent.policy.explanation import explain
from xhagent.policy.placement import Demand, Peers, Reason, decide_demand, evaluate, evaluate_nodes
from xhagent.policy.policy import IO_CLASSES
from xhagent.policy.queue import PendingQueue
from xhagent.policy.selector import Selector
from xhagent.policy.state import Allocation, Cluster, GpuShare
from xhagent.policy.task import Requests, Task

EXAMPLES = Path(__file__).resolve().parents[2] / "configs" / "examples"
GiB = 2**30


def make_node(
    name="n1", numa=((4, 4),), smt=2, gpus=(), rack=None, zone=None, memory=64, io=(), tpus=()
) -> Node:
    """numa: per NUMA node, the number of cores in each of its L3 domains.
    gpus: (cuda, total GiB, free GiB, numa, island-peers, name) tuples.
    tpus: the NUMA node of each TPU chip."""
    cores_total = sum(sum(n) for n in numa)
    numa_out, core_id, l3_id = [], 0, 0
    for nid, doms in enumerate(numa):
        l3 = []
        for count in doms:
            cores = [
                {
                    "id": core_id + i,
                    "package": nid,
                    "cpus": [core_id + i + k * cores_total for k in range(smt)],
                }
                for i in range(count)
            ]
            core_id += count
            l3.append({"id": l3_id, "cores": cores})
            l3_id += 1
        numa_out.append({"id": nid, "l3": l3})
    gpu_out = [
        {
            "index": i,
            "uuid": f"GPU-{name}-{i}",
            "name": g[5] if len(g) > 5 else "NVIDIA L4",
            "memoryTotal": g[1] * GiB,
            "memoryFree": int(g[2] * GiB),
            "cudaDriverVersion": g[0],
            "computeCapability": "8.9",
            "numaNode": g[3],
            "nvlinkPeers": list(g[4]),
        }
        for i, g in enumerate(gpus)
    ]
    labels = {k: v for k, v in (("rack", rack), ("zone", zone)) if v}
    io_out = [
        {"name": f"d{i}", "dev": f"8:{i}", "rotational": c == "rotational", "ioPoll": c == "polled"}
        for i, c in enumerate(io)
    ]
    return Node.from_dict(
        {
            "name": name,
            "labels": labels,
            "numa": numa_out,
            "gpus": gpu_out,
            "io": io_out,
            "memory": {"total": memory * GiB, "available": memory * GiB},
            "accelerators": [
                {"index": i, "kind": "tpu", "name": f"accel{i}", "model": "TPU v4", "numaNode": t}
                for i, t in enumerate(tpus)
            ],
        }
    )


def reason(demand: Demand, node: Node, allocations=(), peers_cluster=None) -> str:
    cluster = peers_cluster or Cluster.of([node], allocations)
    decision = decide_demand("t", demand, cluster)
    assert decision.placed is None, decision
    return next(str(r) for r in decision.reasons if r.node == node.name)


L4 = ("12.4", 24, 24, 0, ())


def test_seed_example_reasons_and_placement():
    nodes = load_nodes(EXAMPLES / "nodes.yaml")
    (policy,) = load_items(EXAMPLES / "video-inference-strict.yaml")
    (t,) = load_items(EXAMPLES / "task-infer.yaml")
    q = PendingQueue(Cluster.of(nodes))
    q.submit(t)
    assert q.reevaluate()["infer-1"].placed.node in (
        "node-01",
        "node-02",
    )  # no policy: anywhere with a GPU
    d = q.apply_policy(policy)["infer-1"]
    assert d.placed.node == "node-02" and d.placed.gpus == (GpuShare(0, 16 * GiB, False),)
    # With node-02 taken away, the task stays Pending with the exact reasons.
    q2 = PendingQueue(Cluster.of([n for n in nodes if n.name != "node-02"]), {policy.name: policy})
    q2.submit(t)
    d = q2.reevaluate()["infer-1"]
    assert d.pending
    assert [str(r) for r in d.reasons] == [
        "InsufficientGPUMemory: node-01 GPU 3 has 12 GiB free, task needs 16 GiB",
        "InsufficientGPUHardware: node-03 lacks CUDA 12.2 runtime (has 12.0)",
        "InsufficientGPUHardware: node-04 has no GPU",
    ]
    # Removing the policy re-evaluates at once: without the 16 GiB floor the task takes a whole
    # GPU, and node-01's GPUs hold no scheduled task.
    assert not q2.remove_policy(policy.name)["infer-1"].pending


GPU_DEMAND = Demand("gpu", cpus=1, gpus=1, gpu_memory=16 * GiB)


@pytest.mark.parametrize(
    "demand,node,allocs,expected",
    [
        (
            replace(GPU_DEMAND, min_cuda=Version(12, 2)),
            make_node("node-03", gpus=[("12.0", 40, 40, 0, ())]),
            (),
            "InsufficientGPUHardware: node-03 lacks CUDA 12.2 runtime (has 12.0)",
        ),
        (GPU_DEMAND, make_node("node-04"), (), "InsufficientGPUHardware: node-04 has no GPU"),
        (
            replace(GPU_DEMAND, gpu_model="H100"),
            make_node("n1", gpus=[L4, L4]),
            (),
            "InsufficientGPUHardware: n1 has no H100 GPU (has NVIDIA L4)",
        ),
        (
            replace(GPU_DEMAND, gpus=3),
            make_node("n1", gpus=[L4, L4]),
            (),
            "InsufficientGPUHardware: n1 has 2 suitable GPUs, task needs 3",
        ),
        (
            GPU_DEMAND,
            make_node(
                "node-01",
                gpus=[
                    ("12.4", 24, 8, 0, ()),
                    ("12.4", 24, 10, 0, ()),
                    ("12.4", 24, 6, 0, ()),
                    ("12.4", 24, 12, 0, ()),
                ],
            ),
            (),
            "InsufficientGPUMemory: node-01 GPU 3 has 12 GiB free, task needs 16 GiB",
        ),
        (
            replace(GPU_DEMAND, gpus=2),
            make_node("n1", gpus=[L4, ("12.4", 24, 12.5, 0, ())]),
            (),
            "InsufficientGPUMemory: n1 has 1 GPUs with 16 GiB free, task needs 2 "
            "(next best: GPU 1 has 12.5 GiB free)",
        ),
        (
            replace(GPU_DEMAND, gpu_memory=None),
            make_node("n1", gpus=[L4]),
            [Allocation("other", "n1", (), 0, (GpuShare(0, 4 * GiB, False),))],
            "InsufficientGPUMemory: n1 has 0 unallocated GPUs, task needs 1 whole",
        ),
        (
            Demand("cpu", cpus=9),
            make_node("n1", numa=((4,),)),
            (),
            "InsufficientCPU: n1 has 8 free CPUs, task needs 9",
        ),
        (
            Demand("cpu", cpus=4, smt_exclusive=True),
            make_node("n1", numa=((4,),)),
            [Allocation("o", "n1", (0, 1, 2), 0)],
            "InsufficientCPU: n1 has 2 free CPUs on whole cores (smtExclusive), task needs 4",
        ),
        (
            Demand("cpu", cpus=1, memory=80 * GiB),
            make_node("n1"),
            (),
            "InsufficientMemory: n1 has 64 GiB free, task needs 80 GiB",
        ),
        (
            Demand("cpu", cpus=1, io_class="polled"),
            make_node("n1", io=("flash", "rotational")),
            (),
            "InsufficientIOClass: n1 has no polled block device (has rotational, flash)",
        ),
        (
            Demand("cpu", cpus=1, io_class="flash"),
            make_node("n1"),
            (),
            "InsufficientIOClass: n1 has no flash block device (has no block device)",
        ),
        (
            Demand("cpu", cpus=6, numa_single=True),
            make_node("n1", numa=((2,), (2,))),
            (),
            "NUMAAffinityUnsatisfiable: n1 has at most 4 free CPUs on one NUMA node, "
            "task needs 6 on a single NUMA node",
        ),
        (
            Demand("gpu", cpus=2, gpus=1, numa_affinity="required"),
            make_node("n1", numa=((2,), (2,)), gpus=[("12.4", 24, 24, 1, ())]),
            [Allocation("o", "n1", (2, 3, 6), 0)],
            "NUMAAffinityUnsatisfiable: n1 has no NUMA node with 2 free CPUs and 1 usable GPUs "
            "local to it (at most 4 CPUs, 1 GPUs on one NUMA node)",
        ),
        (
            Demand("cpu", cpus=1, zone="z1"),
            make_node("n1", zone="z2"),
            (),
            "ZoneMismatch: n1 is in zone z2, task needs zone z1",
        ),
        (
            Demand("cpu", cpus=1, zone="z1"),
            make_node("n1"),
            (),
            "ZoneMismatch: n1 has no zone label, task needs zone z1",
        ),
        (
            Demand("tpu", cpus=2, numa_affinity="required"),
            make_node("n1", numa=((2,), (2,)), tpus=(1, 1)),
            [Allocation("o", "n1", (2, 3, 6, 7), 0)],
            "NUMAAffinityUnsatisfiable: n1 has no NUMA node with 2 free CPUs and 1 usable TPU chips"
            " local to it (at most 4 CPUs, 2 TPU chips on one NUMA node)",
        ),
        (Demand("tpu", cpus=1), make_node("n1"), (), "InsufficientTPUHardware: n1 has no TPU"),
        (
            Demand("tpu", cpus=1),
            make_node("n1", tpus=(0,)),
            [Allocation("o", "n1", (), 0, tpus=(0,))],
            "InsufficientTPUHardware: n1 has 0 free TPU chips of 1 (TPU v4), task needs 1",
        ),
    ],
)
def test_every_reason_string(demand, node, allocs, expected):
    assert reason(demand, node, allocs) == expected


@pytest.mark.parametrize(
    "held,chip,cpus",
    [((1,), (0,), {0, 1}), ((0,), (1,), {2, 3})],  # the free chip's NUMA node's CPUs
)
def test_numa_affinity_required_puts_a_tpu_chip_beside_the_cpus(held, chip, cpus):
    node = make_node("n1", numa=((2,), (2,)), smt=1, tpus=(0, 1))
    st_ = Cluster.of([node], [Allocation("o", "n1", (), 0, tpus=held)]).nodes["n1"]
    c = evaluate(Demand("tpu", cpus=2, numa_affinity="required"), st_)
    assert c.tpus == chip and set(c.cpus) == cpus


SENSOR = Selector((("app", "sensor"),))


def two_racks(*allocs):
    return Cluster.of(
        [make_node("n1", rack="r1"), make_node("n2", rack="r2"), make_node("n3")], allocs
    )


@pytest.mark.parametrize(
    "demand,allocs,expected",
    [
        (
            Demand("cpu", cpus=1, rack_affinity="same", rack_peers=SENSOR),
            [Allocation("cam", "n1", (0,), 0, labels=(("app", "sensor"),))],
            {
                "n2": "RackAffinityUnsatisfiable: n2 is in rack r2, "
                "tasks matching app=sensor run in rack r1",
                "n3": "RackAffinityUnsatisfiable: n3 has no rack label, "
                "tasks matching app=sensor run in rack r1",
            },
        ),
        (
            Demand("cpu", cpus=1, rack_affinity="spread", rack_peers=SENSOR),
            [Allocation("cam", "n1", (0,), 0, labels=(("app", "sensor"),))],
            {
                "n1": "RackAffinityUnsatisfiable: n1 rack r1 already runs a task "
                "matching app=sensor, task needs a rack of its own",
                "n3": "RackAffinityUnsatisfiable: n3 has no rack label, "
                "task needs a rack of its own",
            },
        ),
        (
            Demand("cpu", cpus=1, same_node_as=SENSOR),
            [Allocation("cam", "n1", (0,), 0, labels=(("app", "sensor"),))],
            {
                "n2": "AffinityUnsatisfiable: n2 runs no task matching app=sensor",
                "n3": "AffinityUnsatisfiable: n3 runs no task matching app=sensor",
            },
        ),
        (
            Demand("cpu", cpus=1, away_from=SENSOR),
            [Allocation("cam", "n1", (0,), 0, labels=(("app", "sensor"),))],
            {"n1": "AntiAffinityUnsatisfiable: n1 runs cam, which matches app=sensor"},
        ),
    ],
)
def test_topology_reasons(demand, allocs, expected):
    cluster = two_racks(*allocs)
    decision = decide_demand("t", demand, cluster)
    got = {}
    for node in cluster.nodes.values():
        out = evaluate(demand, node, Peers(cluster))
        if isinstance(out, Reason):
            got[node.name] = str(out)
    assert got == expected
    assert decision.placed is not None and decision.placed.node not in expected


def test_scoring_prefers_one_l3_numa_local_gpus_and_one_nvlink_island():
    node = make_node(
        "n1",
        numa=((4, 4), (4, 4)),
        gpus=[
            ("12.4", 80, 80, 0, (1,)),
            ("12.4", 80, 80, 0, (0,)),
            ("12.4", 80, 80, 1, (3,)),
            ("12.4", 80, 80, 1, (2,)),
        ],
    )
    # GPU 0 taken; the task wants 2 GPUs: the island {2,3} (NUMA 1) holds both, so its CPUs go
    # to NUMA 1.
    cluster = Cluster.of([node], [Allocation("o", "n1", (), 0, (GpuShare(0, 80 * GiB, True),))])
    d = decide_demand("t", Demand("gpu", cpus=4, gpus=2), cluster).placed
    assert [g.index for g in d.gpus] == [2, 3]
    assert set(d.cpus) <= {8, 9, 10, 11, 24, 25, 26, 27} or set(d.cpus) <= {
        12,
        13,
        14,
        15,
        28,
        29,
        30,
        31,
    }
    assert (
        dict(d.parts)["numa"] == 1.0
        and dict(d.parts)["l3"] == 1.0
        and dict(d.parts)["nvlink"] == 1.0
    )
    # Best fit: a 3-CPU task goes to the L3 domain that has exactly 3 free, not an empty one.
    cluster = Cluster.of([make_node("n1", numa=((4, 4),), smt=1)], [Allocation("o", "n1", (0,), 0)])
    assert decide_demand("t", Demand("cpu", cpus=3), cluster).placed.cpus == (1, 2, 3)


def test_policy_change_reevaluates_every_pending_task_at_once():
    from xhagent.policy.policy import Constraints, GpuConstraint, Rule, SchedulingPolicy

    cluster = Cluster.of([make_node("node-01", numa=((8, 8),), gpus=[("12.0", 24, 24, 0, ())])])
    q = PendingQueue(cluster)
    for i in range(50):
        q.submit(
            Task(f"t{i}", "gpu", (("app", "video-ai-infer"),), Requests(gpus=1, gpu_memory=GiB))
        )
    assert all(not d.pending for d in q.reevaluate().values())
    strict = SchedulingPolicy(
        "strict",
        (
            Rule(
                Selector((("app", "video-ai-infer"),)),
                Constraints(gpu=GpuConstraint(min_cuda_version=Version(12, 2))),
            ),
        ),
        priority=95,
    )
    after = q.apply_policy(strict)
    assert len(after) == 50 and all(
        [str(r) for r in d.reasons]
        == ["InsufficientGPUHardware: node-01 lacks CUDA 12.2 runtime (has 12.0)"]
        for d in after.values()
    )
    assert all(p.priority == 95 for p in q.pending.values())
    assert q.schedule() == [] and len(q.pending) == 50
    assert all(not d.pending for d in q.remove_policy("strict").values())
    placed = q.schedule()
    assert len(placed) == 24 and len(q.pending) == 26  # 24 x 1 GiB on the one GPU
    assert all(p.decision.reasons[0].kind == "InsufficientGPUMemory" for p in q.pending.values())


def test_explain_command_text_and_json():
    args = [
        "explain",
        "--task",
        str(EXAMPLES / "task-infer.yaml"),
        "--policies",
        str(EXAMPLES / "video-inference-strict.yaml"),
        "--nodes",
        str(EXAMPLES / "nodes.yaml"),
    ]
    res = CliRunner().invoke(policy_cli, args)
    assert res.exit_code == 0, res.output
    assert (
        "task infer-1 (gpu): policy video-inference-strict (priority 95, preemption lower-priority)"
        in res.output
    )
    assert (
        "  node-03: InsufficientGPUHardware: node-03 lacks CUDA 12.2 runtime (has 12.0)"
        in res.output
    )
    assert (
        "  node-01: InsufficientGPUMemory: node-01 GPU 3 has 12 GiB free, task needs 16 GiB"
        in res.output
    )
    out = json.loads(CliRunner().invoke(policy_cli, [*args, "--json"]).output)["tasks"][0]
    assert out["placed"]["node"] == "node-02" and out["pending"] is False
    assert out["nodes"]["node-04"] == {
        "feasible": False,
        "kind": "InsufficientGPUHardware",
        "reason": "InsufficientGPUHardware: node-04 has no GPU",
    }
    res = CliRunner().invoke(
        policy_cli,
        [
            "explain",
            "--task",
            str(EXAMPLES / "nodes.yaml"),
            "--nodes",
            str(EXAMPLES / "nodes.yaml"),
        ],
    )
    assert res.exit_code == 2 and "no kind: Task document" in res.output


# ------------------------------------------------------------------ properties

gpu_specs = st.tuples(
    st.sampled_from(["11.8", "12.0", "12.2", "12.4"]),
    st.sampled_from([16, 24, 80]),
    st.sampled_from([0.25, 0.5, 1.0]),
    st.integers(0, 1),
    st.sampled_from(["NVIDIA L4", "NVIDIA H100"]),
)


@st.composite
def nodes(draw, name):
    numa = draw(
        st.lists(
            st.lists(st.integers(1, 4), min_size=1, max_size=2).map(tuple), min_size=1, max_size=2
        )
    )
    specs = draw(st.lists(gpu_specs, max_size=4))
    gpus = []
    for i, (cuda, total, frac, nid, model) in enumerate(specs):
        peers = (i ^ 1,) if draw(st.booleans()) and (i ^ 1) < len(specs) else ()
        gpus.append([cuda, total, total * frac, min(nid, len(numa) - 1), peers, model])
    for i, g in enumerate(gpus):  # NVLink peers must be mutual
        if g[4] and i not in gpus[g[4][0]][4]:
            gpus[g[4][0]][4] = (i,)
    return make_node(
        name,
        tuple(numa),
        draw(st.integers(1, 2)),
        [tuple(g) for g in gpus],
        draw(st.sampled_from([None, "r1", "r2"])),
        draw(st.sampled_from([None, "z1", "z2"])),
        draw(st.sampled_from([8, 32, 64])),
        tuple(draw(st.lists(st.sampled_from(IO_CLASSES), max_size=2))),
        tuple(draw(st.lists(st.integers(0, len(numa) - 1), max_size=2))),
    )


def sometimes(value, *more):
    """None (no constraint) most of the time, so that a fair share of demands can be placed."""
    return st.sampled_from([None, None, None, value, *more])


@st.composite
def demands(draw):
    device = draw(st.sampled_from(["cpu", "cpu", "gpu", "gpu", "tpu"]))
    gpu = device == "gpu"
    return Demand(
        device,
        cpus=draw(st.integers(0, 10)),
        memory=draw(st.sampled_from([0, 4 * GiB, 40 * GiB])),
        gpus=draw(st.integers(1, 3)) if gpu else 0,
        gpu_memory=draw(st.sampled_from([None, 4 * GiB, 12 * GiB, 30 * GiB])) if gpu else None,
        min_cuda=draw(sometimes(Version(12, 2))) if gpu else None,
        gpu_model=draw(sometimes("h100")) if gpu else None,
        smt_exclusive=draw(st.booleans()),
        numa_single=draw(st.booleans()),
        numa_affinity=draw(st.sampled_from(["none", "preferred", "required"])),
        io_class=draw(sometimes(*IO_CLASSES)),
        zone=draw(sometimes("z1")),
        rack_affinity=draw(sometimes("same", "spread")),
        rack_peers=SENSOR,
        same_node_as=draw(sometimes(SENSOR)),
        away_from=draw(sometimes(Selector((("app", "batch"),)))),
    )


@st.composite
def clusters(draw):
    ns = [draw(nodes(f"n{i}")) for i in range(draw(st.integers(1, 3)))]
    cluster = Cluster.of(ns)
    # Some tasks already running, placed by the placer itself (sensor and batch peers included).
    for i in range(draw(st.integers(0, 4))):
        app = draw(st.sampled_from(["sensor", "batch", "other"]))
        dem = Demand(
            draw(st.sampled_from(["cpu", "cpu", "tpu"])),
            cpus=draw(st.integers(1, 3)),
            memory=draw(st.sampled_from([0, 8 * GiB])),
        )
        if (c := decide_demand(f"r{i}", dem, cluster).placed) is not None:
            cluster.commit(
                Allocation(f"r{i}", c.node, c.cpus, c.memory, c.gpus, (("app", app),), c.tpus)
            )
    return cluster


def violations(d: Demand, cluster: Cluster, c) -> list[str]:
    """Every hard constraint, checked from scratch against the state before the commit."""
    st_ = cluster.nodes[c.node]
    node = st_.node
    out = []
    if len(c.tpus) != d.tpu_chips or len(set(c.tpus)) != len(c.tpus):
        out.append("tpu count")
    for chip in c.tpus:
        if st_.tpu(chip).holders:
            out.append("tpu held")
    numa_of = {cpu: n for n, _, core in node.cores() for cpu in core.cpus}
    if d.numa_affinity == "required" and c.cpus:
        home = numa_of[c.cpus[0]].id
        if any(st_.tpu(chip).numa != home for chip in c.tpus):
            out.append("tpu numa")
    if len(c.cpus) < d.cpus or not set(c.cpus) <= st_.free_cpus or len(set(c.cpus)) != len(c.cpus):
        out.append("cpus")
    numa_of = {cpu: n for n, _, core in node.cores() for cpu in core.cpus}
    if d.numa_single and len({numa_of[x].id for x in c.cpus}) > 1:
        out.append("numa single")
    if d.smt_exclusive:
        for _, _, core in node.cores():
            if set(core.cpus) & set(c.cpus) and (
                not core.whole or not set(core.cpus) <= set(c.cpus)
            ):
                out.append("smt")
    if c.memory < d.memory or d.memory > st_.memory_free:
        out.append("memory")
    if len(c.gpus) != d.gpus:
        out.append("gpu count")
    for share in c.gpus:
        g, gs = node.gpu(share.index), st_.gpu(share.index)
        if d.min_cuda and g.cuda_driver_version < d.min_cuda:
            out.append("cuda")
        if d.gpu_model and d.gpu_model.lower() not in g.name.lower():
            out.append("model")
        if d.gpu_memory is None and (gs.holders or not share.whole):
            out.append("whole gpu")
        if d.gpu_memory is not None and (
            gs.whole or gs.free < d.gpu_memory or share.memory < d.gpu_memory
        ):
            out.append("gpu memory")
        if d.numa_affinity == "required" and c.cpus and g.numa_node != numa_of[c.cpus[0]].id:
            out.append("gpu numa")
    if d.numa_affinity == "required" and len({numa_of[x].id for x in c.cpus}) > 1:
        out.append("numa required")
    if d.io_class and not any(
        IO_CLASSES.index(b.io_class) >= IO_CLASSES.index(d.io_class) for b in node.io
    ):
        out.append("io")
    if d.zone and node.labels.zone != d.zone:
        out.append("zone")
    peers = (
        {
            cluster.nodes[cluster.where[n]].rack
            for n in cluster.where
            if d.rack_peers
            and d.rack_peers.matches(dict(cluster.nodes[cluster.where[n]].tasks[n].labels))
        }
        if d.rack_affinity
        else set()
    )
    if d.rack_affinity == "same" and peers and node.labels.rack not in peers:
        out.append("rack same")
    if d.rack_affinity == "spread" and (node.labels.rack is None or node.labels.rack in peers):
        out.append("rack spread")
    local = [dict(a.labels) for a in st_.tasks.values()]
    if d.same_node_as and not any(d.same_node_as.matches(lb) for lb in local):
        out.append("sameNodeAs")
    if d.away_from and any(d.away_from.matches(lb) for lb in local):
        out.append("awayFrom")
    return out


@settings(max_examples=500, deadline=None)
@given(clusters(), demands())
def test_a_placement_never_violates_a_hard_constraint(cluster, demand):
    decision = decide_demand("t", demand, cluster)
    if decision.placed is None:
        # Not placed: exactly one typed reason per node, naming it.
        assert sorted(r.node for r in decision.reasons) == sorted(cluster.nodes)
        assert all(
            r.detail.startswith(r.node + " ") and str(r).startswith(r.kind + ": ")
            for r in decision.reasons
        )
        event(sorted({r.kind for r in decision.reasons})[0])
        return
    assert violations(demand, cluster, decision.placed) == []
    # A placed task could be placed: the allocation commits, and the node it chose is feasible.
    assert not isinstance(
        evaluate(demand, cluster.nodes[decision.placed.node], Peers(cluster)), Reason
    )
    event("placed")
    cluster.commit(decision.placed.allocation(Task("t", demand.device_type)))
    assert cluster.where["t"] == decision.placed.node


@settings(max_examples=100, deadline=None)
@given(
    clusters(), st.lists(st.tuples(st.integers(0, 100), st.integers(1, 6)), min_size=1, max_size=12)
)
def test_schedule_places_in_priority_order_and_never_double_books(cluster, specs):
    q = PendingQueue(cluster)
    for i, (prio, cpus) in enumerate(specs):
        q.submit(Task(f"t{i}", "cpu", (), Requests(cpus=cpus), priority=prio))
    order = [p.task.name for p in q.ordered()]
    placed = q.schedule()
    names = [a.task for a in placed]
    assert names == [n for n in order if n in names]  # placed in queue order
    cpus = [
        (a.node, c) for st_ in cluster.nodes.values() for a in st_.tasks.values() for c in a.cpus
    ]
    assert len(cpus) == len(set(cpus))
    for p in q.pending.values():  # the rest have a reason per node
        assert sorted(r.node for r in p.decision.reasons) == sorted(cluster.nodes)


def test_explain_exits_3_when_a_task_is_pending_and_its_json_keys_are_snake_case(tmp_path):
    """0: every task placed; 3: at least one Pending (the README's rule), in text and JSON."""
    strict = tmp_path / "strict.yaml"
    strict.write_text(
        (EXAMPLES / "video-inference-strict.yaml").read_text().replace('"12.2"', '"13.0"')
    )
    args = [
        "explain",
        "--task",
        str(EXAMPLES / "task-infer.yaml"),
        "--policies",
        str(strict),
        "--nodes",
        str(EXAMPLES / "nodes.yaml"),
    ]
    res = CliRunner().invoke(policy_cli, args)
    assert res.exit_code == 3, res.output
    assert "Pending: no node satisfies the hard constraints" in res.output
    res = CliRunner().invoke(policy_cli, [*args, "--json"])
    assert res.exit_code == 3
    out = json.loads(res.output)

    def keys(value):
        if isinstance(value, dict):
            for k, v in value.items():
                yield k
                if k != "nodes":  # node names are data, not field names
                    yield from keys(v)
                else:
                    for verdict in v.values():
                        yield from keys(verdict)
        elif isinstance(value, list):
            for v in value:
                yield from keys(v)

    assert all(k == k.lower() for k in keys(out)), sorted(set(keys(out)))
    assert out["tasks"][0]["pending"] is True and out["tasks"][0]["device_type"] == "gpu"
    assert out["tasks"][0]["policy_priority"] == 95


def test_explain_reads_a_policy_directory_with_other_kinds_in_it(tmp_path):
    for name in ("video-inference-strict.yaml", "cgroup-policy.yaml", "workload-mixed.yaml"):
        (tmp_path / name).write_text((EXAMPLES / name).read_text())
    res = CliRunner().invoke(
        policy_cli,
        [
            "explain",
            "--task",
            str(EXAMPLES / "task-infer.yaml"),
            "--policies",
            str(tmp_path),
            "--nodes",
            str(EXAMPLES / "nodes.yaml"),
        ],
    )
    assert res.exit_code == 0, res.output
    assert "policy video-inference-strict (priority 95" in res.output


@pytest.mark.parametrize(
    "node_cuda, policy_cuda", [("12.10", '"12.10"'), ('"12.10"', "12.10"), ("12.10", "12.10")]
)
def test_unquoted_versions_mean_what_they_say_in_policies_and_node_files(
    tmp_path, node_cuda, policy_cuda
):
    """12.10 > 12.4: unquoted, YAML made 12.1 of it, and a task the quoted form leaves
    Pending was placed (or the other way round for a node)."""
    nodes = tmp_path / "nodes.yaml"
    nodes.write_text(
        (EXAMPLES / "nodes.yaml")
        .read_text()
        .replace('cudaDriverVersion: "12.4"', f"cudaDriverVersion: {node_cuda}")
        .replace('computeCapability: "9.0"', "computeCapability: 9.10")
    )
    assert {g.cuda_driver_version for n in load_nodes(nodes) for g in n.gpus} >= {Version(12, 10)}
    assert {g.compute_capability for n in load_items(nodes) for g in n.gpus} >= {Version(9, 10)}
    strict = tmp_path / "strict.yaml"
    strict.write_text(
        (EXAMPLES / "video-inference-strict.yaml").read_text().replace('"12.2"', policy_cuda)
    )
    (policy,) = load_items(strict)
    assert policy.rules[0].constraints.gpu.min_cuda_version == Version(12, 10)
    res = CliRunner().invoke(
        policy_cli,
        [
            "explain",
            "--task",
            str(EXAMPLES / "task-infer.yaml"),
            "--policies",
            str(strict),
            "--nodes",
            str(nodes),
            "--json",
        ],
    )
    placed = json.loads(res.output)["tasks"][0]["placed"]
    assert res.exit_code == 0 and placed["node"] == "node-02", res.output


# ------------------------------------------------------------------ explain()


def explain_example(strict_text=None, tmp_path=None):
    policies = load_items(EXAMPLES / "video-inference-strict.yaml")
    if strict_text is not None:
        path = tmp_path / "strict.yaml"
        path.write_text(strict_text)
        policies = load_items(path)
    (task,) = load_items(EXAMPLES / "task-infer.yaml")
    return explain(task, policies, Cluster.of(load_nodes(EXAMPLES / "nodes.yaml")))


def test_explain_gives_a_placed_task_a_verdict_for_every_node():
    ex = explain_example()
    assert ex.match.policy.name == "video-inference-strict" and not ex.pending
    assert ex.demand.gpus == 1 and ex.demand.gpu_memory == 16 * GiB and ex.demand.cpus == 4
    assert list(ex.verdicts) == ["node-01", "node-02", "node-03", "node-04"]
    # The chosen node's verdict is the placement itself, with the placement's score.
    assert ex.decision.placed.node == "node-02" and ex.verdicts["node-02"] == ex.decision.placed
    assert ex.verdicts["node-02"].score == ex.decision.placed.score
    # The others: each either feasible (scoring no better) or exactly one typed reason naming it.
    assert [(n, v.kind) for n, v in ex.verdicts.items() if isinstance(v, Reason)] == [
        ("node-01", "InsufficientGPUMemory"),
        ("node-03", "InsufficientGPUHardware"),
        ("node-04", "InsufficientGPUHardware"),
    ]
    assert all(v.node == n for n, v in ex.verdicts.items())
    # the PlacementDecision keeps reasons only when Pending; explain, all
    assert ex.decision.reasons == ()
    record = ex.as_dict()
    assert record["nodes"]["node-02"] == {"feasible": True, "score": ex.decision.placed.score}
    assert record["nodes"]["node-03"]["reason"] == (
        "InsufficientGPUHardware: node-03 lacks CUDA 12.2 runtime (has 12.0)"
    )


def test_explain_gives_a_pending_task_a_reason_for_every_node(tmp_path):
    text = (EXAMPLES / "video-inference-strict.yaml").read_text().replace('"12.2"', '"13.0"')
    ex = explain_example(text, tmp_path)
    assert ex.pending and ex.decision.placed is None
    assert all(isinstance(v, Reason) and v.node == n for n, v in ex.verdicts.items())
    assert ex.decision.reasons == tuple(ex.verdicts.values())
    assert str(ex.verdicts["node-01"]) == (
        "InsufficientGPUHardware: node-01 lacks CUDA 13.0 runtime (has 12.4)"
    )
    assert ex.as_dict()["pending"] is True and ex.as_dict()["placed"] is None


def test_explain_json_is_the_explain_record_and_evaluates_each_node_once(monkeypatch):
    """The CLI renders explain(): one evaluation per task and node, nothing re-evaluated."""
    from xhagent.policy import placement

    calls = []
    real = placement.evaluate

    def counted(d, st_, peers=None):
        calls.append(st_.name)
        return real(d, st_, peers)

    monkeypatch.setattr(placement, "evaluate", counted)
    args = [
        "explain",
        "--task",
        str(EXAMPLES / "task-infer.yaml"),
        "--policies",
        str(EXAMPLES / "video-inference-strict.yaml"),
        "--nodes",
        str(EXAMPLES / "nodes.yaml"),
        "--json",
    ]
    res = CliRunner().invoke(policy_cli, args)
    assert res.exit_code == 0, res.output
    assert calls == ["node-01", "node-02", "node-03", "node-04"]
    monkeypatch.setattr(placement, "evaluate", real)
    assert json.loads(res.output)["tasks"] == [explain_example().as_dict()]


@settings(max_examples=300, deadline=None)
@given(clusters(), demands())
def test_every_node_verdict_is_what_decide_chose_from(cluster, demand):
    verdicts = evaluate_nodes(demand, cluster)
    assert list(verdicts) == list(cluster.nodes)
    peers = Peers(cluster)
    assert verdicts == {n: evaluate(demand, st_, peers) for n, st_ in cluster.nodes.items()}
    decision = decide_demand("t", demand, cluster)
    feasible = [v for v in verdicts.values() if not isinstance(v, Reason)]
    if not feasible:
        assert decision.pending and decision.reasons == tuple(verdicts.values())
    else:
        assert decision.placed == verdicts[decision.placed.node]
        assert decision.placed.score == max(v.score for v in feasible)
