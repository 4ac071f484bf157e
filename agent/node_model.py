"""The resource model of a node: what the scheduling core may hand out, and nothing else.

Ground floor: imports nothing of the agent's packages but other ground-floor modules
(quantity, cpulist, spec), so inventory (which produces it) and the core (which consumes
it) both import it.

Built from the inventory (`xhagent.inventory.build_model`) or loaded from YAML/JSON so the
simulator and tests can describe a node this machine is not. All classes are frozen and
validated on construction; `from_dict` / `load_nodes` report errors with the path of the bad
value (and FILE:LINE:COL for files). Sizes are bytes (ints); in files they may also be
written as `64GiB`, `512MiB`, `3.84TB`, by the one rule of `xhagent.quantity` (`16G` is
16 * 10**9 bytes, `16Gi` 16 * 2**30). Versions are `"MAJOR.MINOR"` strings in files and
`Version(major, minor)` tuples in Python. Keys are camelCase in files, snake_case here.

Schema (one node; a file may also hold `nodes: [<node>, ...]`, optionally `version: 1`)::

    name: gpu-07
    labels: {rack: r12, zone: z1, pool: training}   # rack, zone, any other str->str
    reservedCpus: [0]                  # kept for the system; absent from every `cpus` below
    numa:                              # allocatable CPUs: NUMA node > L3 domain > core
      - id: 0
        memoryTotal: 256GiB
        memoryFree: 240GiB
        distances: {0: 10, 1: 21}      # SLIT distances to every node, by node id
        l3:
          - id: 0                      # L3 cache id (with sub-NUMA clustering one L3 spans 2 nodes)
            sizeBytes: 32MiB
            cores:
              - {id: 0, package: 0, cpus: [64], siblings: [0, 64]}  # SMT sibling 0 reserved
              - {id: 1, package: 0, cpus: [1, 65]}                   # siblings default to cpus
    memory:
      total: 512GiB
      available: 480GiB
      hugepages: [{sizeBytes: 2MiB, total: 1024, free: 1024}]
    gpus:
      - index: 0
        uuid: GPU-4d0c9f0e-1b2a-4c3d-8e9f-0a1b2c3d4e5f
        name: NVIDIA H100 80GB HBM3
        memoryTotal: 80GiB
        memoryFree: 79GiB
        cudaDriverVersion: "12.4"      # nvmlSystemGetCudaDriverVersion, as (major, minor)
        computeCapability: "9.0"
        numaNode: 0                    # null when unknown
        pciBusId: "0000:18:00.0"
        nvlinkPeers: [1]               # GPU indices reachable over an active NVLink
        island: 0                      # NVLink component id; computed when omitted
      - {index: 1, uuid: GPU-9a8b7c6d-0000-4c3d-8e9f-0a1b2c3d4e60, name: NVIDIA H100 80GB HBM3,
         memoryTotal: 80GiB, memoryFree: 80GiB, cudaDriverVersion: "12.4", computeCapability: "9.0",
         numaNode: 0, pciBusId: "0000:2a:00.0", nvlinkPeers: [0], island: 0}
    io:
      - {name: nvme0n1, dev: "259:0", rotational: false, ioPoll: true, pollQueues: 4,
         sizeBytes: 3.84TB, numaNode: 0}
    accelerators:                      # besides NVIDIA GPUs: TPU chips, the kernel's accel class
      - index: 0                       # per kind: TPU chip 0 is TPU_VISIBLE_CHIPS=0
        kind: tpu                      # tpu | accelerator
        name: accel0
        model: TPU v4                  # null when unknown
        pciBusId: "0000:00:04.0"
        numaNode: 0
        deviceNodes: [/dev/accel0]

Only `name` is required for a node; every list defaults to empty. A core's `siblings` are
all its logical CPUs (reserved or offline ones included) so a scheduler can keep
`smtExclusive`: a core is whole (`Core.whole`) when every sibling is allocatable.
"""

from __future__ import annotations

import dataclasses
import json
import re
import types
import typing
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, NewType, Union

import yaml

from .cpulist import MAX_CPUS
from .quantity import abbreviate as _short
from .quantity import kind_of as _kind
from .quantity import parse_size as parse_bytes
from .spec import Document, SpecError, SpecErrors, load_file, load_text

SCHEMA_VERSION = 1

Bytes = NewType("Bytes", int)
"""An int of bytes; files may say `64GiB` / `3.84TB`."""

CpuId = NewType("CpuId", int)
"""A logical CPU id: 0 .. MAX_CPUS - 1 (the kernel's NR_CPUS on common configs)."""

# Every other int of the model (ids, counts, sizes) is a non-negative 64-bit value.
MAX_INT = 2**63 - 1


class Version(NamedTuple):
    major: int
    minor: int

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}"


PathPart = str | int


class ModelError(ValueError):
    """A bad resource model: `where` (FILE:LINE:COL or FILE), the path of the value, what is
    wrong."""

    def __init__(self, path: Sequence[PathPart], message: str, where: str = ""):
        self.path = tuple(path)
        self.message = message
        self.where = where
        super().__init__(str(self))

    def __str__(self) -> str:
        loc = format_path(self.path)
        text = f"{loc}: {self.message}" if loc else self.message
        return f"{self.where}: {text}" if self.where else text

    def under(self, *prefix: PathPart) -> ModelError:
        return ModelError((*prefix, *self.path), self.message, self.where)


def format_path(path: Sequence[PathPart]) -> str:
    out = ""
    for part in path:
        out += (
            f".{part}" if out else str(part)
        )  # list items by index: gpus.0.memoryTotal, as in spec
    return out


def _check(ok: bool, path: Sequence[PathPart], message: str) -> None:
    if not ok:
        raise ModelError(path, message)


def _unique(values: Sequence, path: Sequence[PathPart], what: str) -> None:
    seen = set()
    for v in values:
        _check(v not in seen, path, f"duplicate {what} {v}")
        seen.add(v)


# --------------------------------------------------------------------------- classes


@dataclass(frozen=True)
class Core:
    id: int  # core_id from sysfs (unique within a package)
    package: int
    cpus: tuple[CpuId, ...]  # allocatable logical CPUs of this core
    siblings: tuple[CpuId, ...] = ()  # all SMT siblings; defaults to `cpus`

    def __post_init__(self) -> None:
        if not self.siblings:
            object.__setattr__(self, "siblings", self.cpus)
        _unique(self.cpus, ("cpus",), "cpu")
        extra = sorted(set(self.cpus) - set(self.siblings))
        _check(not extra, ("cpus",), f"cpus {extra} are not among siblings {list(self.siblings)}")

    @property
    def whole(self) -> bool:
        """Every SMT sibling is allocatable: the core can be given exclusively."""
        return set(self.cpus) == set(self.siblings)


@dataclass(frozen=True)
class L3Domain:
    id: int
    size_bytes: Bytes = Bytes(0)
    cores: tuple[Core, ...] = ()

    @property
    def cpus(self) -> tuple[int, ...]:
        return tuple(sorted(c for core in self.cores for c in core.cpus))


@dataclass(frozen=True)
class NumaNode:
    id: int
    memory_total: Bytes = Bytes(0)
    memory_free: Bytes = Bytes(0)
    distances: dict[int, int] = field(default_factory=dict, hash=False)
    l3: tuple[L3Domain, ...] = ()

    def __post_init__(self) -> None:
        _check(
            self.memory_free <= self.memory_total or not self.memory_total,
            ("memoryFree",),
            f"{self.memory_free} exceeds memoryTotal {self.memory_total}",
        )
        _unique([d.id for d in self.l3], ("l3",), "L3 id")

    @property
    def cpus(self) -> tuple[int, ...]:
        return tuple(sorted(c for dom in self.l3 for c in dom.cpus))

    @property
    def cores(self) -> tuple[Core, ...]:
        return tuple(core for dom in self.l3 for core in dom.cores)


@dataclass(frozen=True)
class HugePages:
    size_bytes: Bytes
    total: int = 0
    free: int = 0


@dataclass(frozen=True)
class Memory:
    total: Bytes = Bytes(0)
    available: Bytes = Bytes(0)
    hugepages: tuple[HugePages, ...] = ()

    def __post_init__(self) -> None:
        _check(
            self.available <= self.total or not self.total,
            ("available",),
            f"{self.available} exceeds total {self.total}",
        )


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    name: str
    memory_total: Bytes
    memory_free: Bytes
    cuda_driver_version: Version
    compute_capability: Version
    numa_node: int | None = None
    pci_bus_id: str = ""
    nvlink_peers: tuple[int, ...] = ()
    island: int | None = None  # filled by Node from nvlink_peers when None

    def __post_init__(self) -> None:
        _check(
            self.memory_free <= self.memory_total,
            ("memoryFree",),
            f"{self.memory_free} exceeds memoryTotal {self.memory_total}",
        )
        _check(self.index not in self.nvlink_peers, ("nvlinkPeers",), "a GPU is not its own peer")


@dataclass(frozen=True)
class BlockIo:
    name: str
    dev: str  # MAJ:MIN
    rotational: bool = False
    io_poll: bool = False
    poll_queues: int = 0
    size_bytes: Bytes = Bytes(0)
    numa_node: int | None = None

    def __post_init__(self) -> None:
        _check(
            re.fullmatch(r"\d+:\d+", self.dev) is not None, ("dev",), f"{self.dev!r} is not MAJ:MIN"
        )

    @property
    def io_class(self) -> str:
        """`polled` (IOPOLL ring), `rotational`, or `flash` (interrupt-driven ring)."""
        return "polled" if self.io_poll else "rotational" if self.rotational else "flash"


ACCELERATOR_KINDS = ("tpu", "accelerator")


@dataclass(frozen=True)
class Accelerator:
    """A TPU chip (placement hands these out to `deviceType: tpu` tasks) or another device of
    the kernel's accel class (listed, not yet requested by any task)."""

    index: int
    kind: str
    name: str
    model: str | None = None
    pci_bus_id: str = ""
    numa_node: int | None = None
    device_nodes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _check(
            self.kind in ACCELERATOR_KINDS,
            ("kind",),
            f"{self.kind!r} is not one of {', '.join(ACCELERATOR_KINDS)}",
        )


@dataclass(frozen=True)
class Labels:
    rack: str | None = None
    zone: str | None = None
    extra: dict[str, str] = field(default_factory=dict, hash=False)

    def as_dict(self) -> dict[str, str]:
        known = {k: v for k, v in (("rack", self.rack), ("zone", self.zone)) if v is not None}
        return {**known, **self.extra}

    def get(self, key: str, default: str | None = None) -> str | None:
        return self.as_dict().get(key, default)

    @classmethod
    def _parse(cls, raw: Any, path: tuple) -> Labels:
        if raw is None:
            return cls()
        _check(isinstance(raw, dict), path, f"expected a mapping of label: value, got {_kind(raw)}")
        for key, value in raw.items():
            _check(isinstance(key, str) and key != "", path, f"label key {key!r} is not a string")
            _check(
                isinstance(value, (str, int, float)) and not isinstance(value, bool),
                (*path, key),
                f"label value must be a string, got {_kind(value)}",
            )
        text = {k: str(v) for k, v in raw.items()}
        return cls(text.pop("rack", None), text.pop("zone", None), text)

    def _dump(self) -> dict[str, str]:
        return self.as_dict()


@dataclass(frozen=True)
class Node:
    name: str
    labels: Labels = field(default_factory=Labels, hash=False)
    reserved_cpus: tuple[CpuId, ...] = ()
    numa: tuple[NumaNode, ...] = ()
    memory: Memory = field(default_factory=Memory)
    gpus: tuple[Gpu, ...] = ()
    io: tuple[BlockIo, ...] = ()
    accelerators: tuple[Accelerator, ...] = ()

    def __post_init__(self) -> None:
        _check(self.name != "", ("name",), "must not be empty")
        _unique([n.id for n in self.numa], ("numa",), "NUMA node id")
        allocatable = [c for n in self.numa for c in n.cpus]
        _unique(allocatable, ("numa",), "allocatable cpu")
        both = sorted(set(allocatable) & set(self.reserved_cpus))
        _check(not both, ("reservedCpus",), f"cpus {both} are both reserved and allocatable")
        numa_ids = {n.id for n in self.numa}
        for i, gpu in enumerate(self.gpus):
            _check(
                gpu.numa_node is None or not numa_ids or gpu.numa_node in numa_ids,
                ("gpus", i, "numaNode"),
                f"no NUMA node {gpu.numa_node}",
            )
        for i, dev in enumerate(self.io):
            _check(
                dev.numa_node is None or not numa_ids or dev.numa_node in numa_ids,
                ("io", i, "numaNode"),
                f"no NUMA node {dev.numa_node}",
            )
        for i, acc in enumerate(self.accelerators):
            _check(
                acc.numa_node is None or not numa_ids or acc.numa_node in numa_ids,
                ("accelerators", i, "numaNode"),
                f"no NUMA node {acc.numa_node}",
            )
        _unique([g.index for g in self.gpus], ("gpus",), "GPU index")
        _unique(
            [f"{a.kind} {a.index}" for a in self.accelerators], ("accelerators",), "accelerator"
        )
        _unique([d.name for d in self.io], ("io",), "device name")
        object.__setattr__(self, "gpus", _with_islands(self.gpus))

    # -- queries the scheduler uses
    @property
    def allocatable_cpus(self) -> tuple[int, ...]:
        return tuple(sorted(c for n in self.numa for c in n.cpus))

    def cores(self) -> Iterator[tuple[NumaNode, L3Domain, Core]]:
        for node in self.numa:
            for dom in node.l3:
                for core in dom.cores:
                    yield node, dom, core

    def gpu(self, index: int) -> Gpu:
        for g in self.gpus:
            if g.index == index:
                return g
        raise KeyError(f"node {self.name} has no GPU {index}")

    @property
    def tpus(self) -> tuple[Accelerator, ...]:
        return tuple(a for a in self.accelerators if a.kind == "tpu")

    def islands(self) -> dict[int, tuple[int, ...]]:
        """NVLink island id -> GPU indices in it."""
        out: dict[int, list[int]] = {}
        for g in self.gpus:
            out.setdefault(g.island, []).append(g.index)
        return {k: tuple(sorted(v)) for k, v in sorted(out.items())}

    # -- serialisation
    def to_dict(self) -> dict[str, Any]:
        return _dump(self)

    @classmethod
    def from_dict(cls, raw: Any) -> Node:
        return _parse(cls, raw, ())


def nvlink_islands(peers: dict[int, Sequence[int]]) -> dict[int, int]:
    """GPU index -> island id: connected components of the NVLink graph, numbered by their
    lowest GPU index in order (a GPU without links is an island of its own)."""
    island: dict[int, int] = {}
    next_id = 0
    for start in sorted(peers):
        if start in island:
            continue
        stack = [start]
        while stack:
            g = stack.pop()
            if g in island:
                continue
            island[g] = next_id
            stack.extend(p for p in peers.get(g, ()) if p not in island)
        next_id += 1
    return island


def _with_islands(gpus: tuple[Gpu, ...]) -> tuple[Gpu, ...]:
    indices = {g.index for g in gpus}
    peers = {g.index: set(g.nvlink_peers) for g in gpus}
    for i, g in enumerate(gpus):
        missing = sorted(set(g.nvlink_peers) - indices)
        _check(not missing, ("gpus", i, "nvlinkPeers"), f"no GPU with index {missing}")
        lonely = sorted(p for p in g.nvlink_peers if g.index not in peers[p])
        _check(
            not lonely, ("gpus", i, "nvlinkPeers"), f"GPUs {lonely} do not list {g.index} as a peer"
        )
    computed = nvlink_islands(peers)
    given = {g.index: g.island for g in gpus if g.island is not None}
    if given:
        # Given ids are names; they must partition the GPUs exactly as the links do.
        for i, g in enumerate(gpus):
            _check(g.island is not None, ("gpus", i, "island"), "set on some GPUs but not this one")
        for i, g in enumerate(gpus):
            for other in gpus:
                same_link = computed[g.index] == computed[other.index]
                _check(
                    same_link == (g.island == other.island),
                    ("gpus", i, "island"),
                    f"island {g.island} disagrees with nvlinkPeers (GPU {other.index})",
                )
        return gpus
    return tuple(dataclasses.replace(g, island=computed[g.index]) for g in gpus)


# --------------------------------------------------------------------- dict <-> object


# MAJOR.MINOR, ASCII digits (the CRD's pattern for a version is this one).
VERSION_RE = re.compile(r"([0-9]+)\.([0-9]+)")


def parse_version(value: Any) -> Version:
    """`"12.4"`, `12.4` or `[12, 4]` -> Version(12, 4)."""
    if (
        isinstance(value, (list, tuple))
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    ):
        return Version(*value)
    m = VERSION_RE.fullmatch(str(value)) if isinstance(value, (str, float)) else None
    if not m:
        raise ValueError(f'expected a version MAJOR.MINOR such as "12.4", got {value!r}')
    return Version(int(m.group(1)), int(m.group(2)))


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(w.capitalize() for w in rest)


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


class _Kept(Exception):
    """Errors beneath were kept in the caller's list: the value cannot be built."""


def _all(errors: list[ModelError] | None, calls: list[tuple]) -> list:
    """Each `fn(*args)` of `calls`. With an `errors` list, a ModelError is kept there and the
    others still run (one load reports every error), then _Kept; without one, it raises."""
    out, kept = [], False
    for fn, *args in calls:
        try:
            out.append(fn(*args))
        except _Kept:
            kept = True
        except ModelError as exc:
            if errors is None:
                raise
            errors.append(exc)
            kept = True
    if kept:
        raise _Kept()
    return out


def _parse(tp: Any, raw: Any, path: tuple, errors: list[ModelError] | None = None) -> Any:
    if dataclasses.is_dataclass(tp):
        return _parse_dataclass(tp, raw, path, errors)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (Union, types.UnionType):
        if raw is None and type(None) in args:
            return None
        return _parse(next(a for a in args if a is not type(None)), raw, path, errors)
    try:
        if tp is Bytes:
            return parse_bytes(raw)
        if tp is Version:
            return parse_version(raw)
    except ValueError as exc:
        raise ModelError(path, str(exc)) from None
    if origin is tuple:
        _check(isinstance(raw, list), path, f"expected a list, got {_kind(raw)}")
        return tuple(
            _all(errors, [(_parse, args[0], v, (*path, i), errors) for i, v in enumerate(raw)])
        )
    if origin is dict:
        _check(isinstance(raw, dict), path, f"expected a mapping, got {_kind(raw)}")
        # JSON turns int keys into strings; take them back.
        fix = (
            (lambda k: int(k) if isinstance(k, str) and k.isdigit() else k)
            if args[0] is int
            else (lambda k: k)
        )
        return {
            _parse(args[0], fix(k), path): _parse(args[1], v, (*path, k)) for k, v in raw.items()
        }
    if tp is bool:
        _check(isinstance(raw, bool), path, f"expected true or false, got {_kind(raw)}")
    elif tp in (int, CpuId):
        _check(
            isinstance(raw, int) and not isinstance(raw, bool),
            path,
            f"expected an integer, got {_kind(raw)}",
        )
        hi = MAX_CPUS - 1 if tp is CpuId else MAX_INT
        _check(0 <= raw <= hi, path, f"{_short(raw)} is out of range 0..{hi}")
    elif tp is str:
        _check(isinstance(raw, str), path, f"expected a string, got {_kind(raw)}")
    return raw


def _parse_dataclass(
    cls: type, raw: Any, path: tuple, errors: list[ModelError] | None = None
) -> Any:
    if hasattr(cls, "_parse"):
        return cls._parse(raw, path)
    _check(isinstance(raw, dict), path, f"expected a mapping, got {_kind(raw)}")
    known = {_camel(f.name): f for f in dataclasses.fields(cls)}

    def unknown(key: Any) -> None:
        raise ModelError((*path, key), f"unknown key; expected one of {', '.join(known)}")

    def missing(key: str) -> None:
        raise ModelError(path, f"missing required key {key!r}")

    calls = [
        (_parse, _hints(cls)[known[key].name], value, (*path, key), errors)
        if key in known
        else (unknown, key)
        for key, value in raw.items()
    ]
    calls += [
        (missing, key)
        for key, f in known.items()
        if key not in raw
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]
    values = _all(errors, calls)
    # Every call succeeded (an unknown or missing key raises above): one value per key.
    kwargs = {known[key].name: value for key, value in zip(raw, values, strict=True)}
    try:
        return cls(**kwargs)
    except ModelError as exc:
        raise exc.under(*path) from None


def _dump(value: Any) -> Any:
    if hasattr(value, "_dump"):
        return value._dump()
    if dataclasses.is_dataclass(value):
        return {_camel(f.name): _dump(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Version):
        return str(value)
    if isinstance(value, tuple):
        return [_dump(v) for v in value]
    if isinstance(value, dict):
        return {k: _dump(v) for k, v in value.items()}
    return value


# ----------------------------------------------------------------------- files


def nodes_from_data(data: Any, errors: list[ModelError] | None = None) -> list[Node]:
    """One node mapping, or `{nodes: [...], version: 1}`. With an `errors` list, every
    error is kept there (and _Kept raised) instead of the first being raised."""
    if isinstance(data, dict) and "nodes" in data:
        extra = sorted(set(data) - {"nodes", "version"})
        _check(not extra, (extra[0],) if extra else (), "unknown key; expected nodes, version")
        _check(
            data.get("version", SCHEMA_VERSION) == SCHEMA_VERSION,
            ("version",),
            f"unsupported version {data.get('version')!r}; "
            f"this agent reads version {SCHEMA_VERSION}",
        )
        _check(
            isinstance(data["nodes"], list),
            ("nodes",),
            f"expected a list, got {_kind(data['nodes'])}",
        )
        nodes = _all(
            errors, [(_parse, Node, n, ("nodes", i), errors) for i, n in enumerate(data["nodes"])]
        )
        _unique([n.name for n in nodes], ("nodes",), "node name")
        return nodes
    return [_parse(Node, data, (), errors)]


def load_nodes_text(text: str, source: str = "<string>") -> list[Node]:
    """YAML (JSON is YAML) text -> nodes. ModelError reads one SOURCE:LINE:COL line per error."""
    try:
        docs = load_text(text, source)
    except SpecError as exc:
        raise ModelError((), str(exc)) from None
    return from_documents(docs, source)


def from_documents(docs: list[Document], source: str) -> list[Node]:
    """The nodes of a file read by `xhagent.spec`; every error of it at once, in file order."""
    if not docs:
        raise ModelError((), "empty document; expected a node or `nodes: [...]`", f"{source}:1:1")
    if len(docs) > 1:
        raise ModelError(
            (),
            "expected one document (a node or `nodes: [...]`)",
            "{}:{}:{}".format(source, *docs[1].position(())),
        )
    doc, errors = docs[0], []
    _versions_as_written(doc)
    try:
        nodes = nodes_from_data(doc.value, errors)
    except _Kept:
        pass
    except ModelError as exc:
        errors.append(exc)
    if errors:
        located = [
            doc.error(e.path, f"{format_path(e.path)}: {e.message}" if e.path else e.message)
            for e in errors
        ]
        raise ModelError((), str(SpecErrors(located)))
    return nodes


VERSION_KEYS = ("cudaDriverVersion", "computeCapability")


def _versions_as_written(doc: Document) -> None:
    """Versions are read as written: unquoted `12.10` is 12.10, not the YAML float 12.1."""
    for path, text in doc.texts.items():
        if not path or path[-1] not in VERSION_KEYS:
            continue
        parent = doc.value
        for part in path[:-1]:
            parent = parent[part]
        if isinstance(parent[path[-1]], float):
            parent[path[-1]] = text


def load_nodes(path: str | Path) -> list[Node]:
    try:
        docs = load_file(path)
    except SpecError as exc:
        raise ModelError((), str(exc)) from None
    return from_documents(docs, str(path))


def to_data(nodes: Node | Sequence[Node]) -> dict[str, Any]:
    if isinstance(nodes, Node):
        return nodes.to_dict()
    return {"version": SCHEMA_VERSION, "nodes": [n.to_dict() for n in nodes]}


def dumps_yaml(nodes: Node | Sequence[Node]) -> str:
    return yaml.safe_dump(to_data(nodes), sort_keys=False, default_flow_style=None, width=100)


def dumps_json(nodes: Node | Sequence[Node]) -> str:
    return json.dumps(to_data(nodes), indent=2)
