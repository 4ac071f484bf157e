"""The runtime worker pool the agent hosts (`xhagent run --pool`, agent.yaml `pool:`).

One pinned worker per pool CPU, each in its leaf `<subtree>/pool/<cpu>` of the agent's
own subtree, for Python work of other processes on the node: `agent_pool()`
(xhagent.daemon.api.pool_client) connects a `PoolClient` to it through the address the
agent's Health reply carries, and tasks go through the same shared-memory rings as the
owner's own. Its figures are on the agent's
/metrics (`xhagent_pool_*`). With the agent gone (kill -9) the workers stop once idle;
the next agent kills what is left in `pool/` before it starts its own.

    resolve_cpus(wanted, allowed, reserved) -> [cpu, ...]     pure: which CPUs, or why not
    pool_cpus(config, reserved) -> [cpu, ...]                  the same on this process
    start_pool(cpus, slice_ms, sub, report) -> Pool            the shell
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable

from ...cpulist import format_cpulist

POOL_GROUP = "pool"


class PoolConfigError(ValueError):
    """The pool cannot have the CPUs it was given; the message names them and why."""


def resolve_cpus(
    wanted: Iterable[int] | None, allowed: Iterable[int], reserved: Iterable[int], where: str = ""
) -> list[int]:
    """The pool's CPUs: `wanted` (None: auto, every allowed CPU that is not reserved), each
    of which must be allowed to the agent (its affinity) and not reserved for the system.
    `where` starts the error: the config's FILE:LINE:COL or the option that asked."""
    allowed, reserved = set(allowed), set(reserved)
    prefix = f"{where or 'pool'}: "
    if wanted is None:
        cpus = sorted(allowed - reserved)
        if not cpus:
            raise PoolConfigError(
                f"{prefix}no CPU left for the pool: the agent may use CPUs "
                f"{format_cpulist(sorted(allowed), empty='none')}, all reserved"
            )
        return cpus
    cpus = sorted(set(wanted))
    if not cpus:
        raise PoolConfigError(f"{prefix}no CPU named")
    outside = [c for c in cpus if c not in allowed]
    if outside:
        raise PoolConfigError(
            f"{prefix}{_cpus_are(outside)} not the agent's to use "
            f"(its affinity is {format_cpulist(sorted(allowed), empty='none')})"
        )
    kept = [c for c in cpus if c in reserved]
    if kept:
        raise PoolConfigError(f"{prefix}{_cpus_are(kept)} reserved for the system (reservedCpus)")
    return cpus


def _cpus_are(cpus: list[int]) -> str:
    return f"CPU {cpus[0]} is" if len(cpus) == 1 else f"CPUs {format_cpulist(cpus)} are"


def clear_leftovers(sub) -> list[str]:
    """Kill and remove what an earlier agent's pool left in `<subtree>/pool` (its workers
    stop on their own once idle, a busy one only after its task); the groups removed."""
    from ...cgroups import Cgroup

    top = sub.group(POOL_GROUP).path
    if not top.is_dir():
        return []
    removed = []
    for leaf in sorted(p for p in top.iterdir() if p.is_dir()):
        Cgroup(leaf).remove(kill_first=True)
        removed.append(f"{POOL_GROUP}/{leaf.name}")
    return removed


def pool_cpus(config, node_reserved: Iterable[int]) -> list[int]:
    """The CPUs of `config` (a config.PoolConfig) on this node, checked before anything of
    the agent starts."""
    return resolve_cpus(config.cpus, os.sched_getaffinity(0), node_reserved, config.at)


def start_pool(cpus: list[int], slice_ms: float, sub, report: Callable[[str, str], None]):
    """The pool on `cpus` in the agent's subtree `sub`; ValueError (PoolConfigError) naming
    what went wrong, with no worker left running."""
    from ...runtime.pool import Pool

    removed = clear_leftovers(sub)
    if removed:
        report("PoolLeftovers", f"removed {', '.join(removed)} of an earlier agent's pool")
    try:
        pool = Pool(cpus, slice_ms, sub)
    except RuntimeError as exc:  # a worker that did not start: Pool has stopped the others
        raise PoolConfigError(f"pool: {exc}") from None
    preempt = sorted({w.preempt for w in pool.workers if w.preempt})
    report(
        "Pool",
        f"{len(cpus)} worker(s) on CPUs {format_cpulist(cpus)} in {sub.group(POOL_GROUP).path}, "
        f"slice {slice_ms:g} ms, preemption {'/'.join(preempt) or 'off'}",
    )
    return pool


def describe(pool) -> str:
    """What Health carries: the address a PoolClient connects to, and the CPUs."""
    return json.dumps({"address": list(pool.address), "cpus": pool.cpus})
