"""What a simulation reports: deadline misses, waiting percentiles, preemptions,
utilisation, and seed 003's mixed-load table (per class: p95 latency and error rate
against its SLA, and how often the SLA was violated).

A job "errors" when it finishes after its deadline (a late answer is a failed request).
The SLA violation rate is the share of windows (`window_ns`, by arrival time) in which the
class's p95 latency or error rate exceeded its SLA; windows without jobs of the class do
not count.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from .simulator import JobRecord, Outcome

MS = 1_000_000


@dataclass(frozen=True)
class Sla:
    p95_latency_ns: int | None = None
    error_rate: float | None = None

    def violated(self, p95_ns: float, error_rate: float) -> bool:
        return (self.p95_latency_ns is not None and p95_ns > self.p95_latency_ns) or (
            self.error_rate is not None and error_rate > self.error_rate
        )


def percentile(values: Iterable[float], q: float) -> float:
    """Nearest-rank percentile (the smallest value with at least q% at or below it)."""
    ordered = sorted(values)
    if not ordered:
        return 0.0
    rank = max(1, -(-len(ordered) * q // 100))
    return ordered[int(rank) - 1]


def _miss_ratio(records: list[JobRecord]) -> float:
    with_deadline = [r for r in records if r.job.deadline_ns is not None]
    return sum(r.missed for r in with_deadline) / len(with_deadline) if with_deadline else 0.0


def class_table(records: list[JobRecord], slas: dict[str, Sla], window_ns: int) -> dict[str, dict]:
    by_class: dict[str, list[JobRecord]] = defaultdict(list)
    for r in records:
        by_class[r.job.cls].append(r)
    table = {}
    for cls, recs in sorted(by_class.items()):
        sla = slas.get(cls, Sla())
        p95 = percentile((r.latency_ns for r in recs), 95)
        errors = sum(r.missed for r in recs) / len(recs)
        windows: dict[int, list[JobRecord]] = defaultdict(list)
        for r in recs:
            windows[r.job.arrival_ns // window_ns].append(r)
        violated = sum(
            sla.violated(
                percentile((r.latency_ns for r in w), 95), sum(r.missed for r in w) / len(w)
            )
            for w in windows.values()
        )
        table[cls] = {
            "jobs": len(recs),
            "p95_latency_ms": p95 / MS,
            "sla_p95_latency_ms": None if sla.p95_latency_ns is None else sla.p95_latency_ns / MS,
            "error_rate": errors,
            "sla_error_rate": sla.error_rate,
            "sla_violation_rate": violated / len(windows),
            "meets_sla": not sla.violated(p95, errors),
        }
    return table


def summarize(
    outcome: Outcome, slas: dict[str, Sla] | None = None, window_ns: int = 1_000_000_000
) -> dict:
    records = outcome.records
    waits = [r.waiting_ns for r in records]
    span = max(outcome.makespan_ns, 1)
    return {
        "algorithm": outcome.algorithm,
        "jobs": len(records),
        "deadline_miss_ratio": _miss_ratio(records),
        "waiting_ms": {f"p{q}": percentile(waits, q) / MS for q in (50, 95, 99)},
        "preemptions": outcome.preemptions,
        "migrations": outcome.migrations,
        "utilisation": {
            d: outcome.busy_ns[d] / (n * span) for d, n in sorted(outcome.slots.items())
        },
        "makespan_ms": outcome.makespan_ns / MS,
        "classes": class_table(records, slas or {}, window_ns),
        **({"gpu_memory": gpu_memory(outcome)} if outcome.gpu_memory_modelled else {}),
    }


def gpu_memory(outcome: Outcome) -> dict:
    """Failed allocations per cause and, under dwps, what the evictions bought: `avoided`
    is the fragmentation failures that an eviction turned into a start at that instant."""
    return {
        "failed_allocations": dict(outcome.failed_allocations),
        "avoided": outcome.compactions,
        "failed_compactions": outcome.failed_compactions,
        "threshold_path": [[t / MS, v] for t, v in outcome.threshold_path],
    }


def migration(with_: Outcome, without: Outcome, slas: dict[str, Sla], window_ns: int) -> dict:
    """The controller's moves, each with its reason, and the same jobs run without it."""
    m = with_.migration

    def sla(outcome: Outcome) -> dict:
        return {
            "deadline_miss_ratio": _miss_ratio(outcome.records),
            "missed": sum(r.missed for r in outcome.records),
            "classes": {
                name: {k: c[k] for k in ("p95_latency_ms", "error_rate", "meets_sla")}
                for name, c in class_table(outcome.records, slas, window_ns).items()
            },
        }

    return {
        "interval_ms": m.interval_ns / MS,
        "hot_above": m.hot_above,
        "idle_below": m.idle_below,
        "checkpoint_ms": m.checkpoint_ns / MS,
        "moves": [
            {
                "at_ms": t / MS,
                "task": mv.task,
                "src": mv.src,
                "dst": mv.dst,
                "reason": mv.reason,
                "penalty_ms": mv.penalty_ns / MS,
            }
            for t, mv in with_.moves
        ],
        "unenacted": with_.unenacted,
        **sla(with_),
        "without": sla(without),
    }
