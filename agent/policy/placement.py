"""Placement: filter nodes by hard constraints, then score what is left.

`Demand` is what a task needs once its winning policy's constraints are applied (a
constraint only ever raises a request). Each node either yields a `Candidate` (the CPUs,
GPUs, TPU chips and memory it would give, and a score) or exactly one `Reason` why not,
checked in a fixed order (TPU hardware, zone, GPU hardware, GPU memory, CPU, memory, IO
class, NUMA, rack, node affinity) so the first thing a node lacks is what the user reads.

A `deviceType: tpu` task takes one whole TPU chip: the TaskSpec has no TPU count
(`coreAssignment` names TPU cores, an affinity, and placement does not read it), so a TPU
task needs at least one free chip of the node model's `accelerators` of kind tpu.

Nothing is ever relaxed: a task that fits nowhere stays Pending with its reasons.

Scores (0..100) weigh NUMA locality (CPUs on one NUMA node with their GPUs and TPU chips),
L3 sharing (fewest L3 domains for the CPU set), NVLink islands (GPUs on one island) and
fragmentation (best fit: the tightest NUMA node, GPU and memory that still fit).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..node_model import Version
from ..quantity import human
from .policy import IO_CLASSES, Match, min_gpu_memory
from .selector import Selector
from .state import Allocation, Cluster, GpuShare, GpuState, NodeResources, TpuState
from .task import Task

DEFAULT_CPUS = 1
WEIGHTS = {"numa": 0.3, "l3": 0.2, "nvlink": 0.2, "fit": 0.3}
# enough free bytes on a GPU whose memory is laid out (dwps), none of its blocks enough
FRAGMENTED = "GpuMemoryFragmented"


@dataclass(frozen=True)
class Demand:
    device_type: str
    cpus: int
    memory: int = 0
    gpus: int = 0
    gpu_memory: int | None = None  # per GPU; None: each GPU whole
    min_cuda: Version | None = None
    gpu_model: str | None = None
    tpus: int = 0  # whole TPU chips; a tpu task needs at least 1 (`tpu_chips`)
    smt_exclusive: bool = False
    numa_single: bool = False
    numa_affinity: str = "none"
    io_class: str | None = None
    zone: str | None = None
    rack_affinity: str | None = None
    rack_peers: Selector | None = None
    same_node_as: Selector | None = None
    away_from: Selector | None = None

    @classmethod
    def of(cls, task: Task, match: Match) -> Demand:
        c, r = match.constraints, task.requests
        gpus = max(r.gpus or 0, c.gpu.count or 0)
        mem_floor = min_gpu_memory(c)
        gpu_memory = max((m for m in (r.gpu_memory, mem_floor) if m is not None), default=None)
        topo = c.topology
        peers = topo.rack_peers or (
            match.rule.selector if match.rule and topo.rack_affinity else None
        )
        return cls(
            device_type=task.device_type,
            cpus=max(r.cpus if r.cpus is not None else DEFAULT_CPUS, c.cpu.cores or 0),
            memory=max(r.memory or 0, c.memory or 0),
            gpus=gpus,
            gpu_memory=gpu_memory if gpus else None,
            min_cuda=c.gpu.min_cuda_version if gpus else None,
            gpu_model=c.gpu.model if gpus else None,
            tpus=1 if task.device_type == "tpu" else 0,
            smt_exclusive=c.cpu.smt_exclusive,
            numa_single=c.cpu.numa == "single",
            numa_affinity=topo.numa_affinity or "none",
            io_class=c.io_class,
            zone=topo.zone,
            rack_affinity=topo.rack_affinity,
            rack_peers=peers,
            same_node_as=topo.same_node_as,
            away_from=topo.away_from,
        )

    @property
    def tpu_chips(self) -> int:
        return max(self.tpus, 1) if self.device_type == "tpu" else self.tpus

    @property
    def needs_peers(self) -> bool:
        return bool(self.rack_affinity or self.same_node_as or self.away_from)


@dataclass(frozen=True)
class Reason:
    kind: str
    node: str
    detail: str  # starts with the node name

    def __str__(self) -> str:
        return f"{self.kind}: {self.detail}"


@dataclass(frozen=True)
class Candidate:
    node: str
    cpus: tuple[int, ...]
    memory: int
    gpus: tuple[GpuShare, ...]
    score: float
    parts: tuple[tuple[str, float], ...]  # the score's components, each 0..1
    tpus: tuple[int, ...] = ()  # TPU chip indices

    def allocation(self, task: Task) -> Allocation:
        return Allocation(
            task.name, self.node, self.cpus, self.memory, self.gpus, task.labels, self.tpus
        )


@dataclass(frozen=True)
class PlacementDecision:
    task: str
    placed: Candidate | None
    reasons: tuple[Reason, ...]  # one per node when not placed
    version: int  # Cluster.version it was computed on

    @property
    def pending(self) -> bool:
        return self.placed is None


def decide(task: Task, match: Match, cluster: Cluster) -> PlacementDecision:
    return decide_demand(task.name, Demand.of(task, match), cluster)


def decide_demand(name: str, demand: Demand, cluster: Cluster) -> PlacementDecision:
    return decision_of(name, evaluate_nodes(demand, cluster), cluster.version)


def evaluate_nodes(demand: Demand, cluster: Cluster) -> dict[str, Candidate | Reason]:
    """Every node's verdict on `demand`, in the cluster's order: what it would give (a
    `Candidate` with its score) or the one `Reason` it cannot. `decide` and `explain` both
    decide from this, so what explain shows is what the scheduler decided on."""
    peers = Peers(cluster) if demand.needs_peers else None
    return {name: evaluate(demand, st, peers) for name, st in cluster.nodes.items()}


def decision_of(
    name: str, verdicts: dict[str, Candidate | Reason], version: int
) -> PlacementDecision:
    """The best-scoring candidate (ties: the first node name); Pending with every node's
    reason when no node can take the task."""
    best: Candidate | None = None
    reasons = []
    for out in verdicts.values():
        if isinstance(out, Reason):
            reasons.append(out)
        elif best is None or (out.score, best.node) > (best.score, out.node):
            best = out
    if best is not None:
        return PlacementDecision(name, best, (), version)
    return PlacementDecision(name, None, tuple(reasons), version)


# --------------------------------------------------------------------------- filter


def evaluate(d: Demand, st: NodeResources, peers: Peers | None = None) -> Candidate | Reason:
    n = st.name
    tpus: list[TpuState] = []
    if d.tpu_chips:
        tpus = [t for t in st.tpus if not t.holders]
        if len(tpus) < d.tpu_chips:
            return _tpu_reason(d, st, tpus)
    if d.zone is not None and st.zone != d.zone:
        where = f"is in zone {st.zone}" if st.zone else "has no zone label"
        return Reason("ZoneMismatch", n, f"{n} {where}, task needs zone {d.zone}")
    gpus: list[GpuState] = []
    if d.gpus:
        suitable = suitable_gpus(d, st)
        if isinstance(suitable, Reason):
            return suitable
        gpus = [g for g in suitable if _fits(d, g)]
        if len(gpus) < d.gpus:
            return _gpu_memory_reason(d, st, suitable, gpus)
    units = _cpu_units(d, st)
    free = sum(dom[2] for dom in units)
    if free < d.cpus:
        whole = " on whole cores (smtExclusive)" if d.smt_exclusive else ""
        return Reason("InsufficientCPU", n, f"{n} has {free} free CPUs{whole}, task needs {d.cpus}")
    if st.memory_free < d.memory:
        return Reason(
            "InsufficientMemory",
            n,
            f"{n} has {human(st.memory_free)} free, task needs {human(d.memory)}",
        )
    if d.io_class is not None and st.io_rank < IO_CLASSES.index(d.io_class):
        has = ", ".join(st.io_classes) or "no block device"
        return Reason("InsufficientIOClass", n, f"{n} has no {d.io_class} block device (has {has})")
    numas = _numa_choices(d, st, units, gpus, tpus)
    if isinstance(numas, Reason):
        return numas
    if peers is not None and (why := peers.check(d, st)) is not None:
        return why
    return max((_place(d, st, units, gpus, numa, tpus) for numa in numas), key=lambda c: c.score)


def _tpu_reason(d: Demand, st: NodeResources, free: list[TpuState]) -> Reason:
    n = st.name
    need = f"task needs {d.tpu_chips}"
    if st.tpus:
        models = ", ".join(sorted({t.model or "unknown model" for t in st.tpus}))
        return Reason(
            "InsufficientTPUHardware",
            n,
            f"{n} has {len(free)} free TPU chips of {len(st.tpus)} ({models}), {need}",
        )
    others = ", ".join(f"{a.name} {a.model or a.pci_bus_id or ''}".rstrip() for a in st.others)
    return Reason(
        "InsufficientTPUHardware", n, f"{n} has no TPU" + (f" (has {others})" if others else "")
    )


def suitable_gpus(d: Demand, st: NodeResources) -> list[GpuState] | Reason:
    n = st.name
    if not st.gpus:
        return Reason("InsufficientGPUHardware", n, f"{n} has no GPU")
    gpus = st.gpus
    if d.gpu_model is not None:
        gpus = [g for g in gpus if d.gpu_model.lower() in g.name.lower()]
        if not gpus:
            names = ", ".join(sorted({g.name for g in st.gpus}))
            return Reason(
                "InsufficientGPUHardware", n, f"{n} has no {d.gpu_model} GPU (has {names})"
            )
    if d.min_cuda is not None:
        newest = max(g.cuda for g in gpus)
        gpus = [g for g in gpus if g.cuda >= d.min_cuda]
        if not gpus:
            return Reason(
                "InsufficientGPUHardware",
                n,
                f"{n} lacks CUDA {_v(d.min_cuda)} runtime (has {_v(newest)})",
            )
    if len(gpus) < d.gpus:
        return Reason(
            "InsufficientGPUHardware", n, f"{n} has {len(gpus)} suitable GPUs, task needs {d.gpus}"
        )
    return gpus


def _fits(d: Demand, g: GpuState) -> bool:
    if d.gpu_memory is None:
        return g.holders == 0
    block = g.free if g.largest_block is None else g.largest_block
    return not g.whole and min(g.free, block) >= d.gpu_memory


def _gpu_memory_reason(
    d: Demand, st: NodeResources, suitable: list[GpuState], fitting: list[GpuState]
) -> Reason:
    n = st.name
    if d.gpu_memory is None:
        return Reason(
            "InsufficientGPUMemory",
            n,
            f"{n} has {len(fitting)} unallocated GPUs, task needs {d.gpus} whole",
        )
    short = max((g for g in suitable if g not in fitting), key=lambda g: (g.free, -g.index))
    scattered = [g for g in suitable if g not in fitting and not g.whole]
    scattered = [g for g in scattered if g.free >= d.gpu_memory and g.largest_block is not None]
    if scattered and len(fitting) + len(scattered) >= d.gpus:
        g = max(scattered, key=lambda g: (g.largest_block, -g.index))
        return Reason(
            FRAGMENTED,
            n,
            f"{n} GPU {g.index} has {human(g.free)} free, its largest free block "
            f"{human(g.largest_block)}, task needs {human(d.gpu_memory)} in one block",
        )
    if d.gpus == 1:
        return Reason(
            "InsufficientGPUMemory",
            n,
            f"{n} GPU {short.index} has {human(short.free)} free, task needs {human(d.gpu_memory)}",
        )
    return Reason(
        "InsufficientGPUMemory",
        n,
        f"{n} has {len(fitting)} GPUs with {human(d.gpu_memory)} free, task needs {d.gpus} "
        f"(next best: GPU {short.index} has {human(short.free)} free)",
    )


def _v(v) -> str:
    return f"{v[0]}.{v[1]}"


# Per L3 domain: (numa, free allocation units, how many CPUs they hold).
Units = list[tuple[int, list[tuple[int, ...]], int]]


def _cpu_units(d: Demand, st: NodeResources) -> Units:
    """Free CPUs grouped per L3 domain; with smtExclusive the unit is a whole free core."""
    free = st.free_cpus
    out = []
    for dom in st.domains:
        if d.smt_exclusive:
            us = [c for c in dom.cores if free.issuperset(c)]
            out.append((dom.numa, us, sum(map(len, us))))
        else:
            us = [(c,) for c in sorted(dom.cpus & free)]
            out.append((dom.numa, us, len(us)))
    return out


def _numa_choices(
    d: Demand, st: NodeResources, units: Units, gpus: list[GpuState], tpus: list[TpuState]
) -> list[int | None] | Reason:
    """NUMA nodes to try (None: any mix); a Reason when single-NUMA placement is impossible.
    `numaAffinity: required` puts the CPUs and the devices (GPUs, TPU chips) on one."""
    per_numa = {numa: 0 for numa in st.numa_ids}
    for numa, _, size in units:
        per_numa[numa] += size
    single = d.numa_single or d.numa_affinity == "required"
    # (what, how many wanted, the usable ones) of each device kind that must be local
    strict = [
        (what, want, have)
        for what, want, have in (("GPUs", d.gpus, gpus), ("TPU chips", d.tpu_chips, tpus))
        if d.numa_affinity == "required" and want
    ]
    if not single or not (d.cpus or strict):
        # Each NUMA node that could hold the CPUs alone; a mix only when none can.
        fitting = [k for k in per_numa if per_numa[k] >= d.cpus]
        return fitting if len(per_numa) > 1 and d.cpus and fitting else [None]

    def local(k, have) -> int:
        return sum(dev.numa == k for dev in have)

    ok = [
        k
        for k in per_numa
        if per_numa[k] >= d.cpus and all(local(k, have) >= want for _, want, have in strict)
    ]
    if ok:
        return ok
    n = st.name
    most = max(per_numa.values(), default=0)
    if strict:
        wanted = " and ".join(f"{want} usable {what}" for what, want, _ in strict)
        most_local = ", ".join(
            f"{max((local(k, have) for k in per_numa), default=0)} {what}"
            for what, _, have in strict
        )
        return Reason(
            "NUMAAffinityUnsatisfiable",
            n,
            f"{n} has no NUMA node with {d.cpus} free CPUs and {wanted} local to it "
            f"(at most {most} CPUs, {most_local} on one NUMA node)",
        )
    return Reason(
        "NUMAAffinityUnsatisfiable",
        n,
        f"{n} has at most {most} free CPUs on one NUMA node, "
        f"task needs {d.cpus} on a single NUMA node",
    )


# ---------------------------------------------------------------------------- score


def _place(
    d: Demand,
    st: NodeResources,
    units: Units,
    gpus: list[GpuState],
    numa: int | None,
    tpus: list[TpuState],
) -> Candidate:
    if numa is not None and d.numa_affinity == "required":
        gpus = [g for g in gpus if g.numa == numa]
        tpus = [t for t in tpus if t.numa == numa]
    chosen_gpus = _pick_gpus(d, gpus, numa)
    # TPU chips: local to `numa` first, then the lowest index.
    chosen_tpus = sorted(tpus, key=lambda t: (numa is not None and t.numa != numa, t.index))
    chosen_tpus = chosen_tpus[: d.tpu_chips]
    home = numa if numa is not None else _home([*chosen_gpus, *chosen_tpus], units)
    cpus, used_domains = _pick_cpus(d, units, home, numa is not None)
    parts = {}
    devices = [*chosen_gpus, *chosen_tpus]
    if d.cpus or devices:
        on_home = sum(len(u) for dom, us in used_domains if dom == home for u in us)
        cpu_local = on_home / len(cpus) if cpus else 1.0
        gpu_local = sum(g.numa == home for g in devices) / len(devices) if devices else 1.0
        parts["numa"] = cpu_local * gpu_local
    if cpus:
        biggest = max(dom[2] for dom in units)
        parts["l3"] = -(-len(cpus) // max(biggest, 1)) / len(used_domains)
    if len(chosen_gpus) > 1:
        parts["nvlink"] = 1 / len({g.island for g in chosen_gpus})
    fits = []
    if cpus:
        pool = sum(size for dom, _, size in units if numa is None or dom == numa)
        fits.append(len(cpus) / pool)
    if d.memory:
        fits.append(d.memory / st.memory_free if st.memory_free else 1.0)
    if d.gpu_memory is not None and chosen_gpus:
        fits.append(sum(d.gpu_memory / g.free for g in chosen_gpus) / len(chosen_gpus))
    if fits:
        parts["fit"] = sum(fits) / len(fits)
    weight = sum(WEIGHTS[k] for k in parts) or 1.0
    score = round(100 * sum(WEIGHTS[k] * v for k, v in parts.items()) / weight, 3)
    shares = tuple(
        GpuShare(g.index, g.free if d.gpu_memory is None else d.gpu_memory, d.gpu_memory is None)
        for g in chosen_gpus
    )
    return Candidate(
        st.name,
        tuple(sorted(cpus)),
        d.memory,
        shares,
        score,
        tuple((k, round(v, 4)) for k, v in parts.items()),
        tuple(sorted(t.index for t in chosen_tpus)),
    )


def _home(gpus: list[GpuState | TpuState], units: Units) -> int | None:
    for g in gpus:
        if g.numa is not None:
            return g.numa
    return max(units, key=lambda dom: dom[2])[0] if units else None


def _pick_gpus(d: Demand, gpus: list[GpuState], numa: int | None) -> list[GpuState]:
    """`d.gpus` GPUs: one NVLink island if one can hold them (the tightest such island),
    local to `numa` first, and for shared GPUs the least free memory that still fits."""
    if not d.gpus:
        return []

    def order(g: GpuState):
        return (
            g.numa != numa if numa is not None else 0,
            g.free if d.gpu_memory is not None else 0,
            g.index,
        )

    islands: dict[int | None, list[GpuState]] = {}
    for g in gpus:
        islands.setdefault(g.island, []).append(g)
    whole = [grp for grp in islands.values() if len(grp) >= d.gpus]
    if whole and d.gpus > 1:
        grp = min(whole, key=lambda grp: (len(grp), min(map(order, grp))))
        return sorted(grp, key=order)[: d.gpus]
    return sorted(gpus, key=order)[: d.gpus]


def _pick_cpus(d: Demand, units: Units, home: int | None, single: bool):
    """CPUs filling the fewest L3 domains: the tightest domain that holds them all, else the
    fullest domains first; domains of `home` first (all of them when `single`)."""
    if not d.cpus:
        return [], []
    doms = [dom for dom in units if dom[1] and (not single or dom[0] == home)]
    holding = [dom for dom in doms if dom[2] >= d.cpus]
    if holding:
        order = [min(holding, key=lambda dom: (dom[0] != home, dom[2]))]
    else:
        order = sorted(doms, key=lambda dom: (dom[0] != home, -dom[2]))
    cpus: list[int] = []
    used = []
    for numa, us, _ in order:
        taken = []
        for u in us:
            if len(cpus) >= d.cpus:
                break
            cpus.extend(u)
            taken.append(u)
        if taken:
            used.append((numa, taken))
        if len(cpus) >= d.cpus:
            break
    return cpus, used


# ---------------------------------------------------------------------------- peers


class Peers:
    """Placed tasks by node, for rack affinity and sameNodeAs / awayFrom."""

    def __init__(self, cluster: Cluster):
        self.cluster = cluster
        self._racks: dict[Selector, set[str | None]] = {}

    def racks(self, sel: Selector) -> set[str | None]:
        if sel not in self._racks:
            self._racks[sel] = {
                st.rack for st, a in self.cluster.placed() if sel.matches(dict(a.labels))
            }
        return self._racks[sel]

    def check(self, d: Demand, st: NodeResources) -> Reason | None:
        n = st.name
        if d.rack_affinity and d.rack_peers is not None:
            racks = self.racks(d.rack_peers)
            named = ", ".join(sorted(r or "(none)" for r in racks))
            if d.rack_affinity == "same" and racks and st.rack not in racks:
                where = f"is in rack {st.rack}" if st.rack else "has no rack label"
                return Reason(
                    "RackAffinityUnsatisfiable",
                    n,
                    f"{n} {where}, tasks matching {d.rack_peers} run in rack {named}",
                )
            if d.rack_affinity == "spread" and (st.rack is None or st.rack in racks):
                why = (
                    f"rack {st.rack} already runs a task matching {d.rack_peers}"
                    if st.rack
                    else "has no rack label"
                )
                return Reason(
                    "RackAffinityUnsatisfiable", n, f"{n} {why}, task needs a rack of its own"
                )
        local = [dict(a.labels) for a in st.tasks.values()]
        if d.same_node_as is not None and not any(d.same_node_as.matches(lb) for lb in local):
            return Reason("AffinityUnsatisfiable", n, f"{n} runs no task matching {d.same_node_as}")
        if d.away_from is not None:
            clash = next(
                (a.task for a in st.tasks.values() if d.away_from.matches(dict(a.labels))), None
            )
            if clash is not None:
                return Reason(
                    "AntiAffinityUnsatisfiable", n, f"{n} runs {clash}, which matches {d.away_from}"
                )
        return None


def reasons_text(reasons: Iterable[Reason]) -> list[str]:
    return [str(r) for r in reasons]
