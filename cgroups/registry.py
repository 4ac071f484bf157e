"""The one declaration of every cgroup file the agent reads or writes.

Each file is declared once with its controller, how its kernel text is parsed, how a
value is formatted for writing (one write per line: the kernel takes one entry per
write for keyed files), the validator for user input, and, for policy settings, the
policy field it backs and how a change orders (loosen top-down, tighten bottom-up).
Nothing else in the code spells a cgroup file name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..cpulist import parse_cpulist
from . import values

# Controllers that may be enabled in a cgroup holding processes (threaded-capable); the
# others are domain controllers, refused with EBUSY there (no internal processes).
THREADED_CONTROLLERS = frozenset({"cpu", "cpuset", "perf_event", "pids"})


def _limit(old: Any, new: Any) -> str:
    return "loosen" if values.as_number(new) >= values.as_number(old) else "tighten"


def _cpu_max_limit(old: Any, new: Any) -> str:
    if old is None:
        return "loosen"
    ratio = lambda x: values.as_number(x[0]) / x[1]  # noqa: E731 - quota per period
    return "loosen" if ratio(new) >= ratio(old) else "tighten"


def _set_limit(old: Any, new: Any) -> str:
    # An empty cpuset means "inherit the parent's": the loosest value.
    if old == "":
        return "tighten" if new else "loosen"
    if new == "":
        return "loosen"
    return "loosen" if set(parse_cpulist(new)) >= set(parse_cpulist(old)) else "tighten"


def _per_device_limit(old: Any, new: Any) -> str:
    for dev, limits in new.items():
        for key, value in limits.items():
            if values.as_number(value) < values.as_number(
                (old or {}).get(dev, {}).get(key, values.MAX)
            ):
                return "tighten"
    return "loosen"


def _neutral(old: Any, new: Any) -> str:
    return "loosen"


def _entries_match(actual: Any, desired: Any) -> bool:
    return isinstance(actual, dict) and all(actual.get(k) == w for k, w in desired.items())


def _limits_match(actual: Any, desired: Any) -> bool:
    return isinstance(actual, dict) and all(
        all(actual.get(dev, {}).get(k) == lim for k, lim in limits.items())
        for dev, limits in desired.items()
    )


@dataclass(frozen=True)
class CgroupFile:
    name: str
    controller: str | None = None  # None: a core (cgroup.*) file, always present
    parse: Callable[[str], Any] = values.parse_scalar
    format: Callable[[Any], list[str]] = lambda value: [str(value)]
    validate: Callable[[Any], Any] | None = None
    policy: tuple[str, str] | None = None  # (section, field) in a CgroupPolicy group
    direction: Callable[[Any, Any], str] = _neutral
    order: int = 0  # within one group: lower first when loosening, last when tightening
    matches: Callable[[Any, Any], bool] = lambda actual, desired: actual == desired
    optional: bool = False  # may be absent even where its controller is enabled

    def __str__(self) -> str:
        return self.name


def _one(fmt: Callable[[Any], str]) -> Callable[[Any], list[str]]:
    return lambda value: [fmt(value)]


# -- core files ----------------------------------------------------------------------
CONTROLLERS = CgroupFile("cgroup.controllers", parse=str.split)
SUBTREE_CONTROL = CgroupFile("cgroup.subtree_control", parse=str.split)
PROCS = CgroupFile("cgroup.procs", parse=lambda t: [int(p) for p in t.split()])
THREADS = CgroupFile("cgroup.threads", parse=lambda t: [int(p) for p in t.split()])
EVENTS = CgroupFile("cgroup.events", parse=values.parse_flat_keyed)
FREEZE = CgroupFile("cgroup.freeze", validate=values.boolean01)
KILL = CgroupFile("cgroup.kill")
TYPE = CgroupFile("cgroup.type", parse=str.strip)
CGROUP_STAT = CgroupFile("cgroup.stat", parse=values.parse_flat_keyed)
MAX_DEPTH = CgroupFile("cgroup.max.depth")  # `max` or a count of levels below the group
MAX_DESCENDANTS = CgroupFile("cgroup.max.descendants")

# -- settings a CgroupPolicy can hold ---------------------------------------------------------
IO_WEIGHT = CgroupFile(
    "io.weight",
    "io",
    values.parse_weight_file,
    values.format_weight_lines,
    policy=("io", "weight"),
    matches=_entries_match,
)
IO_MAX = CgroupFile(
    "io.max",
    "io",
    values.parse_nested_keyed,
    values.format_nested_keyed,
    policy=("io", "max"),
    direction=_per_device_limit,
    matches=_limits_match,
)
IO_BFQ_WEIGHT = CgroupFile(
    "io.bfq.weight",
    "io",
    values.parse_weight_file,
    values.format_weight_lines,
    matches=_entries_match,
    optional=True,
)
# The root's io.cost settings per device (root only): `MAJ:MIN enable=1 ctrl=user rpct=...`
# and `MAJ:MIN ctrl=user model=linear rbps=...`; a kernel without io.cost has neither. A
# CgroupPolicy's spec.ioCost sets them; what it gives must read back (other keys are the
# kernel's). The model is written before the qos.
IO_COST_QOS = CgroupFile(
    "io.cost.qos",
    "io",
    values.parse_nested_keyed,
    values.format_nested_keyed,
    matches=_limits_match,
    optional=True,
)
IO_COST_MODEL = CgroupFile(
    "io.cost.model",
    "io",
    values.parse_nested_keyed,
    values.format_nested_keyed,
    matches=_limits_match,
    optional=True,
)
ROOT_IO_COST = (IO_COST_MODEL, IO_COST_QOS)  # in the order they are written
CPU_WEIGHT = CgroupFile("cpu.weight", "cpu", validate=values.weight, policy=("cpu", "weight"))
CPU_IDLE = CgroupFile(
    "cpu.idle", "cpu", validate=values.boolean01, policy=("cpu", "idle"), optional=True
)
CPU_MAX = CgroupFile(
    "cpu.max",
    "cpu",
    values.cpu_max,
    _one(values.format_cpu_max),
    values.cpu_max,
    policy=("cpu", "max"),
    direction=_cpu_max_limit,
)
# The burst must not exceed the quota (EINVAL): written after cpu.max when loosening,
# before it when tightening.
CPU_MAX_BURST = CgroupFile(
    "cpu.max.burst",
    "cpu",
    validate=values.int_range(0, 2**62),
    policy=("cpu", "max.burst"),
    direction=_limit,
    order=1,
    optional=True,
)
CPUSET_CPUS = CgroupFile(
    "cpuset.cpus",
    "cpuset",
    values.cpulist,
    validate=values.cpulist,
    policy=("cpuset", "cpus"),
    direction=_set_limit,
)
CPUSET_MEMS = CgroupFile(
    "cpuset.mems",
    "cpuset",
    values.cpulist,
    validate=values.cpulist,
    policy=("cpuset", "mems"),
    direction=_set_limit,
)
CPUSET_PARTITION = CgroupFile(
    "cpuset.cpus.partition",
    "cpuset",
    values.word,
    validate=values.partition,
    policy=("cpuset", "partition"),
    order=1,
)
MEMORY_MIN = CgroupFile(
    "memory.min", "memory", validate=values.bytes_or_max, policy=("memory", "min"), direction=_limit
)
MEMORY_LOW = CgroupFile(
    "memory.low", "memory", validate=values.bytes_or_max, policy=("memory", "low"), direction=_limit
)
MEMORY_HIGH = CgroupFile(
    "memory.high",
    "memory",
    validate=values.bytes_or_max,
    policy=("memory", "high"),
    direction=_limit,
)
MEMORY_MAX = CgroupFile(
    "memory.max", "memory", validate=values.bytes_or_max, policy=("memory", "max"), direction=_limit
)
MEMORY_SWAP_MAX = CgroupFile(
    "memory.swap.max",
    "memory",
    validate=values.bytes_or_max,
    policy=("memory", "swap.max"),
    direction=_limit,
    optional=True,
)
PIDS_MAX = CgroupFile(
    "pids.max", "pids", validate=values.count_or_max, policy=("pids", "max"), direction=_limit
)

# -- statistics ------------------------------------------------------------------------
CPU_STAT = CgroupFile(
    "cpu.stat", parse=values.parse_flat_keyed
)  # core: usage_usec without the cpu controller
IO_STAT = CgroupFile("io.stat", "io", values.parse_nested_keyed)
MEMORY_STAT = CgroupFile("memory.stat", "memory", values.parse_flat_keyed)
MEMORY_CURRENT = CgroupFile("memory.current", "memory")
MEMORY_EVENTS = CgroupFile("memory.events", "memory", values.parse_flat_keyed)
PIDS_CURRENT = CgroupFile("pids.current", "pids")
# Pressure files exist with or without the controllers (PSI is core); cpu.stat too.
CPU_PRESSURE = CgroupFile("cpu.pressure", parse=values.parse_nested_keyed, optional=True)
IO_PRESSURE = CgroupFile("io.pressure", parse=values.parse_nested_keyed, optional=True)
MEMORY_PRESSURE = CgroupFile("memory.pressure", parse=values.parse_nested_keyed, optional=True)

SETTINGS = tuple(f for f in globals().copy().values() if isinstance(f, CgroupFile) and f.policy)
STATS = (
    CGROUP_STAT,
    CPU_STAT,
    IO_STAT,
    MEMORY_CURRENT,
    MEMORY_STAT,
    MEMORY_EVENTS,
    PIDS_CURRENT,
    CPU_PRESSURE,
    IO_PRESSURE,
    MEMORY_PRESSURE,
)
BY_NAME = {f.name: f for f in globals().copy().values() if isinstance(f, CgroupFile)}
BY_POLICY = {f.policy: f for f in SETTINGS}
POLICY_SECTIONS = {
    section: [fld for s, fld in BY_POLICY if s == section] for section, _ in BY_POLICY
}


def lookup(name: str) -> CgroupFile:
    """The declaration of a file by name; unknown names are refused with a suggestion."""
    try:
        return BY_NAME[name]
    except KeyError:
        from difflib import get_close_matches

        close = get_close_matches(name, BY_NAME, n=1)
        raise KeyError(
            f"no cgroup file {name!r} is declared"
            + (f" (did you mean {close[0]!r}?)" if close else "")
        ) from None


class Support:
    """Which declared files the hierarchy supports, decided once per cgroup2 root: the
    controller must be offered by the root, and an optional file must also exist in some
    group below the root where its controller is enabled (the first one found is the probe)."""

    def __init__(self, root: str | Path, available: list[str] | None = None):
        self.root = Path(root)
        self.available = frozenset(
            available
            if available is not None
            else CONTROLLERS.parse((self.root / CONTROLLERS.name).read_text())
        )
        self._cache: dict[str, bool] = {}

    def supported(self, f: CgroupFile) -> bool:
        if f.name not in self._cache:
            self._cache[f.name] = self._check(f)
        return self._cache[f.name]

    def _check(self, f: CgroupFile) -> bool:
        if f.controller is not None and f.controller not in self.available:
            return False
        if not f.optional:
            return True
        if (self.root / f.name).exists():
            return True
        probe = self._probe_group(f.controller)
        return probe is None or (probe / f.name).exists()

    def _probe_group(self, controller: str | None) -> Path | None:
        for parent in [self.root, *(p for p in self.root.iterdir() if p.is_dir())]:
            try:  # groups come and go while this looks (another agent, systemd)
                if (
                    controller is None
                    or controller in (parent / SUBTREE_CONTROL.name).read_text().split()
                ):
                    for child in parent.iterdir():
                        if child.is_dir():
                            return child
            except OSError:  # removed meanwhile (ENOENT, or ENODEV on a file opened just before)
                continue
        return None
