"""Placement speed, for `xhagent bench sched` (issue 7 targets: >= 20k decisions/s with
1,000 pending tasks on a 64-CPU 8-GPU node; per-decision cost at 100k pending <= 2x the
cost at 1k; re-evaluating 10k pending tasks after a policy change < 100 ms).

A decision is: take the first pending task in queue order, filter and score every node
for it, put it back in the queue. The node is half full (CPUs and GPU memory) so the
filter and the scoring both have work to do; nothing is committed, so every decision sees
the same state and the figures compare like with like. Runs in a few seconds.
"""

from __future__ import annotations

import random
import sys
import time

from ..node_model import Node, Version
from ..policy.placement import decide_demand
from ..policy.policy import (
    Constraints,
    CpuConstraint,
    GpuConstraint,
    Rule,
    SchedulingPolicy,
    Topology,
)
from ..policy.queue import PendingQueue
from ..policy.selector import Selector
from ..policy.state import Cluster
from ..policy.task import Requests, Task
from ..quantity import GiB

TARGET_DECISIONS_PER_S = 20_000
TARGET_GROWTH = 2.0
TARGET_REEVALUATE_S = 0.100
APPS = ("video-ai-infer", "batch-etl", "feature-store", "trainer", "log-archive")
TIERS = ("gold", "silver", "bronze")


def bench_node(name: str = "bench-64c8g") -> Node:
    """2 NUMA nodes x 2 L3 domains x 8 SMT-2 cores = 64 CPUs; 8 H100s in 2 NVLink islands."""
    numa, cpu = [], 0
    for n in range(2):
        l3 = []
        for d in range(2):
            cores = []
            for c in range(8):
                cores.append({"id": c + 8 * d, "package": n, "cpus": [cpu, cpu + 32]})
                cpu += 1
            l3.append({"id": 2 * n + d, "cores": cores})
        numa.append({"id": n, "memoryTotal": "256GiB", "memoryFree": "250GiB", "l3": l3})
    gpus = [
        {
            "index": i,
            "uuid": f"GPU-{i}",
            "name": "NVIDIA H100 80GB HBM3",
            "memoryTotal": "80GiB",
            "memoryFree": "80GiB",
            "cudaDriverVersion": "12.4",
            "computeCapability": "9.0",
            "numaNode": i // 4,
            "nvlinkPeers": [j for j in range(4 * (i // 4), 4 * (i // 4) + 4) if j != i],
        }
        for i in range(8)
    ]
    return Node.from_dict(
        {
            "name": name,
            "labels": {"rack": "r1", "zone": "z1"},
            "numa": numa,
            "memory": {"total": "512GiB", "available": "500GiB"},
            "gpus": gpus,
        }
    )


def tasks(n: int, rng: random.Random, prefix: str = "t") -> list[Task]:
    out = []
    for i in range(n):
        labels = (("app", rng.choice(APPS)), ("tier", rng.choice(TIERS)))
        if rng.random() < 0.4:
            per_gpu = rng.choice((8, 16, 24, None))  # None: whole GPUs
            req = Requests(
                cpus=rng.choice((1, 2, 4)),
                memory=rng.choice((4, 8, 16)) * GiB,
                gpus=rng.choice((1, 1, 2)),
                gpu_memory=per_gpu * GiB if per_gpu else None,
            )
            out.append(Task(f"{prefix}{i}", "gpu", labels, req, priority=rng.randrange(101)))
        else:
            req = Requests(cpus=rng.choice((1, 2, 4, 8)), memory=rng.choice((1, 2, 4, 8)) * GiB)
            out.append(Task(f"{prefix}{i}", "cpu", labels, req, priority=rng.randrange(101)))
    return out


def half_full_cluster(rng: random.Random) -> Cluster:
    cluster = Cluster.of([bench_node()])
    q = PendingQueue(cluster)
    filler = [
        Task(f"fill{i}", "cpu", (("app", "filler"),), Requests(cpus=4, memory=16 * GiB))
        for i in range(8)
    ]
    filler += [
        Task(
            f"gfill{i}",
            "gpu",
            (("app", "filler"),),
            Requests(cpus=0, gpus=1, gpu_memory=rng.choice((24, 40)) * GiB),
        )
        for i in range(6)
    ]
    q.extend(filler)
    q.schedule()
    return cluster


def strict_policy() -> SchedulingPolicy:
    """The seed policy's shape on the benchmark's labels, with a CPU constraint added."""
    return SchedulingPolicy(
        "bench-strict",
        (
            Rule(
                Selector((("app", "video-ai-infer"),)),
                Constraints(
                    gpu=GpuConstraint(min_cuda_version=Version(12, 2), min_memory_gb=16),
                    cpu=CpuConstraint(numa="single"),
                    topology=Topology(numa_affinity="preferred"),
                ),
            ),
        ),
        priority=95,
    )


def _decisions_per_s(pending: int, rng: random.Random, min_seconds: float) -> tuple[float, int]:
    cluster = half_full_cluster(rng)
    q = PendingQueue(cluster, {"bench-strict": strict_policy()})
    q.extend(tasks(pending, rng))
    done, start = 0, time.perf_counter()
    while True:
        for _ in range(500):
            p = q.pop()
            decide_demand(p.task.name, p.demand, cluster)
            q.requeue(p)
        done += 500
        elapsed = time.perf_counter() - start
        if elapsed >= min_seconds:
            return done / elapsed, done


def placement_speed(
    pending: int = 1000,
    large: int = 100_000,
    reevaluate: int = 10_000,
    min_seconds: float = 0.5,
    seed: int = 7,
) -> dict:
    rng = random.Random(seed)
    print(f"placement: {pending} pending...", file=sys.stderr)
    rate, n_small = _decisions_per_s(pending, rng, min_seconds)
    print(f"placement: {large} pending...", file=sys.stderr)
    rate_large, n_large = _decisions_per_s(large, rng, min_seconds)

    print(
        f"placement: re-evaluating {reevaluate} pending after a policy change...", file=sys.stderr
    )
    q = PendingQueue(half_full_cluster(rng))
    q.extend(tasks(reevaluate, rng))
    start = time.perf_counter()
    decisions = q.apply_policy(strict_policy())
    reeval_s = time.perf_counter() - start
    growth = (1 / rate_large) / (1 / rate)
    return {
        "node": "64 CPUs (2 NUMA x 2 L3 x 8 SMT-2 cores), 8 GPUs (2 NVLink islands), half full",
        "pending": pending,
        "decisions": n_small,
        "decisions_per_s": round(rate),
        "us_per_decision": round(1e6 / rate, 2),
        "decisions_per_s_target": TARGET_DECISIONS_PER_S,
        "decisions_vs_target": round(rate / TARGET_DECISIONS_PER_S, 3),
        "large_pending": large,
        "us_per_decision_large": round(1e6 / rate_large, 2),
        "cost_growth": round(growth, 3),
        "cost_growth_target": TARGET_GROWTH,
        "reevaluate_pending": reevaluate,
        "reevaluate_distinct_demands": len({p.demand for p in q.pending.values()}),
        "reevaluate_pending_now_placeable": sum(not d.pending for d in decisions.values()),
        "reevaluate_ms": round(reeval_s * 1000, 2),
        "reevaluate_vs_target": round(reeval_s / TARGET_REEVALUATE_S, 3),
        "ok": rate >= TARGET_DECISIONS_PER_S
        and growth <= TARGET_GROWTH
        and reeval_s < TARGET_REEVALUATE_S,
    }


if __name__ == "__main__":
    import json

    print(json.dumps(placement_speed(), indent=2))
