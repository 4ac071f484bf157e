"""`kind: SchedulingPolicy`: which tasks a policy governs and the hard constraints it imposes.

A constraint raises what a task gets and never lowers it: `hardware.cpu.cores: 8` on a task
that requests 4 CPUs places it with 8; `minMemoryGB: 16` needs 16 GiB free on each GPU
the task gets. Within one policy the first matching rule applies; among policies the
highest `priority` wins, and two equal-priority policies that can match the same task
are a validation warning (the tie is broken by name so the outcome is still defined).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .. import fields
from ..node_model import VERSION_RE, Version, parse_version
from ..quantity import MAX_SIZE, SIZE_PATTERN, GiB, format_size, parse_size
from ..sched import queues
from ..sched.mlq import Level, MultiLevel
from ..sched.queues import DEFAULT_NODE_ALGORITHM, NODE_ALGORITHMS
from ..spec import Cursor, Document
from .selector import SELECTOR, Selector, parse_selector
from .units import format_duration, parse_duration_ns

API_VERSION = "xh.scheduling/v1"
DEFAULT_PRIORITY = 50
PREEMPTION = ("never", "lower-priority", "deadline-driven", "queueing")
RACK_AFFINITY = ("same", "spread")
NUMA_AFFINITY = ("none", "preferred", "required")
# Block device classes of the inventory (`BlockIo.io_class`), weakest first: a class is
# satisfied by a device of that class or a stronger one.
IO_CLASSES = ("rotational", "flash", "polled")


@dataclass(frozen=True)
class GpuConstraint:
    min_cuda_version: Version | None = None
    min_memory_gb: int | None = None  # GiB free on each GPU the task gets
    count: int | None = None
    model: str | None = None  # case-insensitive substring of the GPU name


@dataclass(frozen=True)
class CpuConstraint:
    cores: int | None = None
    smt_exclusive: bool = False
    numa: str | None = None  # "single": every CPU on one NUMA node


@dataclass(frozen=True)
class Topology:
    rack_affinity: str | None = None
    rack_peers: Selector | None = None  # whose rack; default: the rule's own selector
    zone: str | None = None
    numa_affinity: str | None = None  # CPUs and devices (GPUs, TPU chips) on one NUMA node
    same_node_as: Selector | None = None
    away_from: Selector | None = None


@dataclass(frozen=True)
class Constraints:
    gpu: GpuConstraint = GpuConstraint()
    cpu: CpuConstraint = CpuConstraint()
    memory: int | None = None  # bytes
    io_class: str | None = None
    topology: Topology = Topology()


@dataclass(frozen=True)
class Rule:
    selector: Selector
    constraints: Constraints = Constraints()


@dataclass(frozen=True)
class Migration:
    """`spec.migration`: the load-driven migration controller (xhagent.sched.migration).
    Every `interval`, a device above `hot_above` load may shed a migratable task onto one
    below `idle_below`; a move stops the task for `checkpoint_ns` (simulation)."""

    interval_ns: int = 5_000_000_000
    hot_above: float = 0.85
    idle_below: float = 0.3  # the seed's idle bound is lost from its text: ours
    checkpoint_ns: int = 100_000_000

    def __post_init__(self):
        if not 0 <= self.idle_below < self.hot_above <= 1:
            raise ValueError(f"idleBelow {self.idle_below} is not below hotAbove {self.hot_above}")


@dataclass(frozen=True)
class Queueing:
    """`spec.queueing`: the discipline (xhagent.sched.queues) that orders the node's
    Pending tasks. One node has one order: of the policies in force that set it, the one
    with the highest `priority` decides (ties by name), as `queueing_in_force` says.
    `levels`: mlq's, most urgent first, each claiming the tasks whose labels hold its
    `matchLabels` (one without is the fallback); () for the simulator's default levels."""

    algorithm: str = DEFAULT_NODE_ALGORITHM
    levels: tuple[Level, ...] = ()

    def discipline(self, **state) -> queues.Discipline:
        if self.algorithm == "mlq" and self.levels:
            state.setdefault("levels", MultiLevel(self.levels))
        return queues.discipline(self.algorithm, **state)


@dataclass(frozen=True)
class SchedulingPolicy:
    name: str
    rules: tuple[Rule, ...]
    priority: int = DEFAULT_PRIORITY
    preemption: str = "lower-priority"
    labels: tuple[tuple[str, str], ...] = ()
    migration: Migration | None = None  # None: no migration controller
    queueing: Queueing | None = None  # None: leaves the order to other policies

    def rule_for(self, labels: Mapping[str, str]) -> Rule | None:
        return next((r for r in self.rules if r.selector.matches(labels)), None)


# ------------------------------------------------------------------------- parsing

# DNS-1123 subdomain names, as Kubernetes uses for metadata.name: lowercase letters, digits,
# `-` and `.`, starting and ending alphanumeric, at most 253 characters. A name reaches
# messages, JSON and (later) file and cgroup names: no `/`, `..`, spaces or control characters.
NAME_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
NAME_RULE = (
    "lowercase letters, digits, '-' and '.', starting and ending with a letter or digit, "
    "at most 253"
)


def parse_name(cur: Cursor) -> str:
    """metadata.name of a SchedulingPolicy or a Task (see NAME_RULE)."""
    name = cur.str()
    if len(name) > 253 or not NAME_RE.fullmatch(name):
        shown = name if len(name) <= 60 else name[:57] + "..."
        raise cur.error(f"{cur.where}: {shown!r} is not a valid name ({NAME_RULE})")
    return name


# The fields of a SchedulingPolicy, each read and described (`xhagent crd`) by one
# declaration: the keys each mapping allows and requires, and every value's Field.
HEADER_FIELDS = ("apiVersion", "kind", "metadata", "spec")
HEADER_REQUIRED = HEADER_FIELDS
METADATA_FIELDS, METADATA_REQUIRED = ("name", "labels"), ("name",)
SPEC_FIELDS = ("matchRules", "priority", "preemption", "migration", "queueing")
SPEC_REQUIRED = ("matchRules",)
RULE_FIELDS, RULE_REQUIRED = ("selector", "constraints"), ("selector",)
PRIORITY = fields.Int(0, 100, default=DEFAULT_PRIORITY)
PREEMPTION_FIELD = fields.Choice(PREEMPTION, default="lower-priority")
# A duration: `5s`, `250ms`, `1m30s`, or a whole number of seconds.
DURATION_PATTERN = r"^((\d+(\.\d*)?|\.\d+)(h|ms|m|s|us|µs|ns))+$"


def duration_field(lo_ns: int, hi_ns: int, default: int) -> fields.Field:
    """A duration within lo_ns..hi_ns; a bare number is whole seconds (what the CRD's
    int-or-string can carry)."""

    def read(c: Cursor) -> int:
        if not c.present:
            return default
        if isinstance(c.value, float):
            raise c.error(f"{c.where}: write {c.value}s: a bare number is whole seconds")
        ns = c.parse(parse_duration_ns, "duration")
        if not lo_ns <= ns <= hi_ns:
            raise c.error(
                f"{c.where}: {c.value} is out of range "
                f"{format_duration(lo_ns) if lo_ns else 0}..{format_duration(hi_ns)}"
            )
        return ns

    lo_s, hi_s = -(-lo_ns // 10**9), hi_ns // 10**9
    schema = fields.int_or_string(lo_s, hi_s, DURATION_PATTERN)
    schema["default"] = format_duration(default)
    return fields.Field(read, schema)


def _algorithm(c: Cursor) -> str:
    name = c.str()
    if name in NODE_ALGORITHMS:
        return name
    raise c.error(f"{c.where}: {name!r} is not one of {', '.join(NODE_ALGORITHMS)}")


MAX_LEVELS = 16


def _levels(c: Cursor) -> tuple[Level, ...]:
    items = c.seq()
    if not items:
        raise c.error(f"{c.where}: give at least one level")
    if len(items) > MAX_LEVELS:
        raise c.error(f"{c.where}: at most {MAX_LEVELS} levels")
    levels: list[Level] = []
    for item in items:
        item.mapping(LEVEL_FIELDS, required=("name",))
        name = parse_name(item["name"])
        if any(lvl.name == name for lvl in levels):
            raise item["name"].error(f"{item['name'].where}: level {name!r} is declared twice")
        labels = dict(parse_labels(item["matchLabels"]))
        fallback = next((lvl.name for lvl in levels if not lvl.match_labels), None)
        if not labels and fallback is not None:
            raise item.error(
                f"{item.where}: only one level may leave out matchLabels, and {fallback!r} "
                "does already (the level of the tasks no other claims)"
            )
        levels.append(Level(name, labels))
    return tuple(levels)


LEVEL_FIELDS = ("name", "matchLabels")
QUEUEING: dict[str, fields.Field] = {
    "algorithm": fields.Field(_algorithm, fields.string(enum=NODE_ALGORITHMS)),
    "levels": fields.Field(
        _levels,
        fields.array(
            fields.obj(
                {"name": fields.string(), "matchLabels": fields.map_of(fields.string())},
                ["name"],
            ),
            min_items=1,
        ),
    ),
}
QUEUEING_REQUIRED = ("algorithm",)

_M = Migration()
MIGRATION: dict[str, fields.Field] = {
    "interval": duration_field(100_000_000, 3600 * 10**9, _M.interval_ns),
    "hotAbove": fields.Number(0, 1, default=_M.hot_above),
    "idleBelow": fields.Number(0, 1, default=_M.idle_below),
    "checkpointCost": duration_field(0, 3600 * 10**9, _M.checkpoint_ns),
}
# One constraint item holds any of these (dotted: the path inside the item); an item is
# `hardware`, `memory`, `io` or `topology`.
CONSTRAINT_ITEM_FIELDS = ("hardware", "memory", "io", "topology")
CONSTRAINTS: dict[str, fields.Field] = {
    "hardware.gpu.minCudaVersion": fields.Parsed(
        parse_version,
        "CUDA version",
        # A string: a JSON number cannot hold 12.10 (it is 12.1), so the CRD asks for text.
        fields.string(pattern=f"^{VERSION_RE.pattern}$"),
        as_written=True,
    ),
    "hardware.gpu.minMemoryGB": fields.Int(1, 1 << 20),
    "hardware.gpu.count": fields.Int(1, 1024),
    "hardware.gpu.model": fields.Str(),
    "hardware.cpu.cores": fields.Int(1, 1 << 16),
    "hardware.cpu.smtExclusive": fields.Bool(),
    "hardware.cpu.numa": fields.Choice(["single"]),
    "memory": fields.Parsed(parse_size, "size", fields.int_or_string(0, MAX_SIZE, SIZE_PATTERN)),
    "io.class": fields.Choice(IO_CLASSES),
    "topology.rackAffinity": fields.Choice(RACK_AFFINITY),
    "topology.rackPeers": fields.Field(parse_selector, SELECTOR),
    "topology.zone": fields.Str(),
    "topology.numaAffinity": fields.Choice(NUMA_AFFINITY),
    "topology.sameNodeAs": fields.Field(parse_selector, SELECTOR),
    "topology.awayFrom": fields.Field(parse_selector, SELECTOR),
}


def parse_metadata(root: Cursor) -> tuple[str | None, tuple[tuple[str, str], ...]]:
    """(name, labels) of a document's metadata; errors are kept in the document."""
    meta, doc = root["metadata"], root.doc
    if not (meta.present and meta.fields(METADATA_FIELDS, required=METADATA_REQUIRED)):
        return None, ()
    name = doc.attempt(lambda: parse_name(meta["name"])) if meta["name"].present else None
    return name, doc.attempt(lambda: parse_labels(meta["labels"]), ())


def parse_header(doc: Document) -> bool:
    """The four top-level fields and apiVersion; False when the document is not a mapping."""
    root = doc.root
    if not root.fields(HEADER_FIELDS, required=HEADER_REQUIRED):
        return False
    if root["apiVersion"].present:
        doc.attempt(lambda: root["apiVersion"].str([API_VERSION]))
    return True


def parse_policy(doc: Document) -> SchedulingPolicy:
    """A SchedulingPolicy; every error of the document at once (SpecErrors)."""
    if not parse_header(doc):
        doc.errors.raise_if_any()
    root = doc.root
    name, labels = parse_metadata(root)
    spec, rules = root["spec"], []
    priority, preemption, migration, queueing = DEFAULT_PRIORITY, "lower-priority", None, None
    if spec.present and spec.fields(SPEC_FIELDS, required=SPEC_REQUIRED):
        if spec["matchRules"].present:
            items = doc.attempt(lambda: spec["matchRules"].seq(), None)
            rules = [parse_rule(rule) for rule in items or ()]
            if items == []:
                doc.errors.add(
                    spec["matchRules"].error("spec.matchRules: a policy needs at least one rule")
                )
        priority = doc.attempt(lambda: PRIORITY.read(spec["priority"]))
        preemption = doc.attempt(lambda: PREEMPTION_FIELD.read(spec["preemption"]))
        if spec["migration"].present:
            migration = parse_migration(spec["migration"])
        if spec["queueing"].present:
            queueing = parse_queueing(spec["queueing"])
    doc.errors.raise_if_any()
    return SchedulingPolicy(
        name=name,
        rules=tuple(rules),
        priority=priority,
        preemption=preemption,
        labels=labels,
        migration=migration,
        queueing=queueing,
    )


def parse_queueing(cur: Cursor) -> Queueing | None:
    """`spec.queueing`; errors are kept in the document."""
    if not cur.fields(QUEUEING, required=QUEUEING_REQUIRED) or not cur["algorithm"].present:
        return None
    algorithm = cur.doc.attempt(lambda: QUEUEING["algorithm"].read(cur["algorithm"]))
    levels: tuple[Level, ...] = ()
    if cur["levels"].present and algorithm is not None:
        levels = cur.doc.attempt(lambda: _levels_of(algorithm, cur["levels"]), ())
    return None if algorithm is None else Queueing(algorithm, levels)


def _levels_of(algorithm: str, c: Cursor) -> tuple[Level, ...]:
    if algorithm != "mlq":
        raise c.error(f"{c.where}: levels are mlq's; {algorithm} has none")
    return QUEUEING["levels"].read(c)


def parse_migration(cur: Cursor) -> Migration | None:
    """`spec.migration` (`{}`: every default); errors are kept in the document."""
    if not cur.fields(MIGRATION):
        return None
    doc, errors = cur.doc, cur.doc.errors.total
    read = {k: doc.attempt(lambda k=k: MIGRATION[k].read(cur[k])) for k in MIGRATION}
    if doc.errors.total != errors:
        return None
    if not read["idleBelow"] < read["hotAbove"]:
        at = cur["idleBelow"] if cur["idleBelow"].present else cur["hotAbove"]
        doc.errors.add(
            at.error(
                f"{cur.where}.idleBelow: {read['idleBelow']} is not below "
                f"hotAbove {read['hotAbove']}"
            )
        )
        return None
    return Migration(read["interval"], read["hotAbove"], read["idleBelow"], read["checkpointCost"])


def parse_rule(rule: Cursor) -> Rule | None:
    if not rule.fields(RULE_FIELDS, required=RULE_REQUIRED):
        return None
    selector = (
        rule.doc.attempt(lambda: parse_selector(rule["selector"]))
        if rule["selector"].present
        else None
    )
    return Rule(selector, parse_constraints(rule["constraints"]))


def parse_labels(cur: Cursor) -> tuple[tuple[str, str], ...]:
    if not cur.present:
        return ()
    out = []
    for key, value in cur.items():
        if isinstance(value.value, bool) or not isinstance(value.value, (str, int, float)):
            raise value.error(f"{value.where}: a label value must be a string")
        out.append((str(key), str(value.value)))
    return tuple(sorted(out))


def parse_constraints(cur: Cursor) -> Constraints:
    """A list of single-purpose items (`- hardware: ...`, `- topology: ...`) merged into one;
    the same field given twice is an error rather than a silent override. Errors are kept in
    the document (a field in error is left at its default here)."""
    doc = cur.doc
    seen: dict[str, Cursor] = {}
    for item in doc.attempt(lambda: cur.seq(default=[]), ()):
        if not item.fields(CONSTRAINT_ITEM_FIELDS):
            continue
        for key, value in _leaves(item):
            if key in seen:
                first = seen[key].doc.position(seen[key].path)[0]
                doc.errors.add(value.error(f"{value.where}: {key} is already set at line {first}"))
                continue
            seen[key] = value

    def get(key):
        return None if key not in seen else doc.attempt(lambda: CONSTRAINTS[key].read(seen[key]))

    gpu = GpuConstraint(
        min_cuda_version=get("hardware.gpu.minCudaVersion"),
        min_memory_gb=get("hardware.gpu.minMemoryGB"),
        count=get("hardware.gpu.count"),
        model=get("hardware.gpu.model"),
    )
    cpu = CpuConstraint(
        cores=get("hardware.cpu.cores"),
        smt_exclusive=get("hardware.cpu.smtExclusive") or False,
        numa=get("hardware.cpu.numa"),
    )
    topo = Topology(
        rack_affinity=get("topology.rackAffinity"),
        rack_peers=get("topology.rackPeers"),
        zone=get("topology.zone"),
        numa_affinity=get("topology.numaAffinity"),
        same_node_as=get("topology.sameNodeAs"),
        away_from=get("topology.awayFrom"),
    )
    if "topology.rackPeers" in seen and "topology.rackAffinity" not in seen:
        peers = seen["topology.rackPeers"]
        doc.errors.add(peers.error(f"{peers.where}: needs rackAffinity (same or spread)"))
    return Constraints(
        gpu=gpu,
        cpu=cpu,
        topology=topo,
        memory=get("memory"),
        io_class=get("io.class"),
    )


def _shape() -> dict[str, Any]:
    """{"hardware": {"gpu": {"minCudaVersion", ...}, ...}, "io": {"class"}, ...} from
    CONSTRAINTS: where each dotted field sits in an item (`memory`, a scalar, is absent)."""
    shape: dict[str, Any] = {}
    for key in CONSTRAINTS:
        parts = key.split(".")
        if len(parts) == 2:
            shape.setdefault(parts[0], set()).add(parts[1])
        elif len(parts) == 3:
            shape.setdefault(parts[0], {}).setdefault(parts[1], set()).add(parts[2])
    return shape


_SHAPE = _shape()


def _leaves(item: Cursor) -> Iterable[tuple[str, Cursor]]:
    """("hardware.gpu.minCudaVersion", cursor), ... with unknown fields kept as errors."""
    for key, value in item.items():
        shape = _SHAPE.get(key)
        if shape is None:  # memory: a scalar
            yield key, value
        elif isinstance(shape, set):
            if value.fields(shape):
                for leaf, cur in value.items():
                    if leaf in shape:
                        yield f"{key}.{leaf}", cur
        elif value.fields(shape):
            for sub, inner in value.items():
                if sub in shape and inner.fields(shape[sub]):
                    for leaf, cur in inner.items():
                        if leaf in shape[sub]:
                            yield f"{key}.{sub}.{leaf}", cur


# ------------------------------------------------------------------------- dumping


def dump_policy(p: SchedulingPolicy) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": p.name}
    if p.labels:
        meta["labels"] = dict(p.labels)
    rules = []
    for r in p.rules:
        rule: dict[str, Any] = {"selector": r.selector.dump()}
        if r.constraints != Constraints():
            rule["constraints"] = dump_constraints(r.constraints)
        rules.append(rule)
    return {
        "apiVersion": API_VERSION,
        "kind": "SchedulingPolicy",
        "metadata": meta,
        "spec": {
            "matchRules": rules,
            "priority": p.priority,
            "preemption": p.preemption,
            **({} if p.migration is None else {"migration": dump_migration(p.migration)}),
            **({} if p.queueing is None else {"queueing": dump_queueing(p.queueing)}),
        },
    }


def dump_queueing(q: Queueing) -> dict[str, Any]:
    levels = [
        {"name": lvl.name, **({"matchLabels": dict(lvl.match_labels)} if lvl.match_labels else {})}
        for lvl in q.levels
    ]
    return {"algorithm": q.algorithm, **({"levels": levels} if levels else {})}


def dump_migration(m: Migration) -> dict[str, Any]:
    return {
        "interval": format_duration(m.interval_ns),
        "hotAbove": m.hot_above,
        "idleBelow": m.idle_below,
        "checkpointCost": format_duration(m.checkpoint_ns),
    }


def dump_constraints(c: Constraints) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    hardware = {
        name: body for name, body in (("gpu", _fields(c.gpu)), ("cpu", _fields(c.cpu))) if body
    }
    if hardware:
        out.append({"hardware": hardware})
    if c.memory is not None:
        out.append({"memory": format_size(c.memory)})
    if c.io_class is not None:
        out.append({"io": {"class": c.io_class}})
    if topo := _fields(c.topology):
        out.append({"topology": topo})
    return out


def _fields(obj: Any) -> dict[str, Any]:
    """Non-default fields in file form (camelCase keys, versions and selectors as text/maps)."""
    out = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if value is None or value is False:
            continue
        key = "".join(w.capitalize() if i else w for i, w in enumerate(f.name.split("_")))
        key = {"minMemoryGb": "minMemoryGB"}.get(key, key)
        out[key] = (
            str(value)
            if isinstance(value, Version)
            else value.dump()
            if isinstance(value, Selector)
            else value
        )
    return out


# ------------------------------------------------------------------------- choosing


@dataclass(frozen=True)
class Match:
    policy: SchedulingPolicy | None
    rule: Rule | None
    tied_with: tuple[str, ...] = ()  # equal-priority policies that also matched

    @property
    def constraints(self) -> Constraints:
        return self.rule.constraints if self.rule else Constraints()


def choose(policies: Iterable[SchedulingPolicy], labels: Mapping[str, str]) -> Match:
    """The highest-priority policy with a rule matching `labels` (ties: first by name)."""
    best: list[tuple[SchedulingPolicy, Rule]] = []
    for p in policies:
        rule = p.rule_for(labels)
        if rule is None:
            continue
        if not best or p.priority > best[0][0].priority:
            best = [(p, rule)]
        elif p.priority == best[0][0].priority:
            best.append((p, rule))
    if not best:
        return Match(None, None)
    best.sort(key=lambda pr: pr[0].name)
    return Match(best[0][0], best[0][1], tuple(p.name for p, _ in best[1:]))


def tie_warnings(policies: Iterable[SchedulingPolicy]) -> list[str]:
    """Pairs of equal-priority policies whose rules can match the same task."""
    ps = sorted(policies, key=lambda p: p.name)
    out = []
    for i, a in enumerate(ps):
        for b in ps[i + 1 :]:
            if a.priority != b.priority:
                continue
            pairs = [
                (ra, rb)
                for ra in a.rules
                for rb in b.rules
                if not ra.selector.disjoint_from(rb.selector)
            ]
            if pairs:
                ra, rb = pairs[0]
                out.append(
                    f"policies {a.name!r} and {b.name!r} both have priority {a.priority} "
                    "and can match the "
                    f"same task ({ra.selector} / {rb.selector}); {a.name!r} wins by name order"
                )
    return out


def deciding_queueing(policies: Iterable[SchedulingPolicy]) -> tuple[Queueing, str]:
    """(the node's `spec.queueing`, the policy that set it; "" for none): of the policies
    that set one, the highest `priority` decides, ties by name; none: the default."""
    setting = [p for p in policies if p.queueing is not None]
    if not setting:
        return Queueing(), ""
    best = min(setting, key=lambda p: (-p.priority, p.name))
    return best.queueing, best.name


def queueing_in_force(policies: Iterable[SchedulingPolicy]) -> tuple[str, str]:
    """(algorithm, the policy that set it; "" for none), as `deciding_queueing`."""
    queueing, decider = deciding_queueing(policies)
    return queueing.algorithm, decider


def queueing_warnings(policies: Iterable[SchedulingPolicy]) -> list[str]:
    """Policies that set another `spec.queueing` than the one that decides: each is
    named, since the node has one order and theirs is not it."""
    policies = list(policies)
    algorithm, decider = queueing_in_force(policies)
    return [
        f"policy {p.name!r} sets spec.queueing.algorithm {p.queueing.algorithm!r}, but "
        f"{decider!r} decides the node's order ({algorithm!r}: higher priority, then name)"
        for p in sorted(policies, key=lambda p: p.name)
        if p.queueing is not None and p.name != decider and p.queueing.algorithm != algorithm
    ]


def policy_warnings(policies: Iterable[SchedulingPolicy]) -> list[str]:
    """What `policy validate` and `explain` warn of: ties, and orders that do not decide."""
    policies = list(policies)
    return tie_warnings(policies) + queueing_warnings(policies)


def min_gpu_memory(c: Constraints) -> int | None:
    return c.gpu.min_memory_gb * GiB if c.gpu.min_memory_gb is not None else None
