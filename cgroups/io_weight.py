"""io.weight done right: devices by name, and who enforces a per-device weight.

`io.weight` holds `default N` and `MAJ:MIN W` lines. A weight is enforced by io.cost when
the device is enabled in the root's `io.cost.qos` (the kernel refuses a per-device line,
EOPNOTSUPP, before that, and after a disable it may accept and ignore it), or by BFQ when
it is the device's scheduler (`io.bfq.weight`, 1..1000, scaled as systemd does).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ..spec import did_you_mean
from . import values

IO_COST = "io.cost"
BFQ = "bfq"
NONE = "none"
BFQ_WEIGHT_MIN, BFQ_WEIGHT_MAX = 1, 1000
WEIGHT_DEFAULT = 100


def bfq_weight(weight: int) -> int:
    """systemd's mapping of io.weight (1..10000, default 100) onto BFQ's 1..1000: identity
    up to the default, then linear from 100 to 1000 (src/core/cgroup.c, BFQ_WEIGHT)."""
    lo, hi = values.WEIGHT_RANGE
    if weight <= WEIGHT_DEFAULT:
        return WEIGHT_DEFAULT - (WEIGHT_DEFAULT - weight) * (WEIGHT_DEFAULT - BFQ_WEIGHT_MIN) // (
            WEIGHT_DEFAULT - lo
        )
    return WEIGHT_DEFAULT + (weight - WEIGHT_DEFAULT) * (BFQ_WEIGHT_MAX - WEIGHT_DEFAULT) // (
        hi - WEIGHT_DEFAULT
    )


class NoSuchDevice(ValueError):
    """A well-formed device name this node does not have (unsupported here, not bad input)."""


def resolve_device(name: str, sys_root: Path = Path("/sys")) -> str:
    """`nvme0n1` -> `259:0` via /sys/block/<dev>/dev; MAJ:MIN passes through. NoSuchDevice
    when this node has no such device, ValueError when the name cannot be one."""
    if re.fullmatch(r"\d+:\d+", name):
        return name
    if "/" in name or name in (".", ".."):
        raise ValueError(f"{name!r} is not a block device name")
    dev = sys_root / "block" / name / "dev"
    try:
        return dev.read_text().strip()
    except OSError:
        known = (
            sorted(p.name for p in (sys_root / "block").iterdir())
            if (sys_root / "block").is_dir()
            else []
        )
        raise NoSuchDevice(
            f"no block device {name!r} on this node"
            + did_you_mean(name, known)
            + (f"; devices: {', '.join(known)}" if known else "")
        ) from None


def device_names(sys_root: Path = Path("/sys")) -> dict[str, str]:
    """MAJ:MIN -> device name, for reports."""
    out = {}
    for entry in sorted((sys_root / "block").glob("*")):
        try:
            out[(entry / "dev").read_text().strip()] = entry.name
        except OSError:
            continue
    return out


def scheduler(majmin: str, sys_root: Path = Path("/sys")) -> str | None:
    """The active scheduler (`[bfq]` in queue/scheduler) of a device, by MAJ:MIN."""
    try:
        text = (sys_root / "dev/block" / majmin / "queue/scheduler").read_text()
    except OSError:
        return None
    match = re.search(r"\[([^\]]+)\]", text)
    return match[1] if match else text.strip() or None


def io_cost_enabled(qos_text: str) -> set[str]:
    """Devices with `enable=1` in the root's io.cost.qos."""
    return {
        dev for dev, keys in values.parse_nested_keyed(qos_text).items() if keys.get("enable") == 1
    }


@dataclass(frozen=True)
class Enforcer:
    device: str  # MAJ:MIN
    name: str  # io.cost | bfq | none
    note: str = ""


def enforcer(
    majmin: str,
    cost_enabled: set[str],
    sched: str | None,
    will_enable_cost: bool = False,
    by: str = "",
) -> Enforcer:
    """`by`: what decides io.cost for the device (spec.ioCost), named in the note."""
    if majmin in cost_enabled or will_enable_cost:
        note = (
            "enabled in io.cost.qos" if majmin in cost_enabled else "io.cost.qos enable=1 planned"
        )
        return Enforcer(majmin, IO_COST, f"{note} ({by})" if by else note)
    if sched == BFQ:
        return Enforcer(majmin, BFQ, "scheduler is bfq: io.bfq.weight written, scaled 1..1000")
    why = (
        f"{by} sets io.cost.qos enable=0"
        if by
        else "device not enabled in io.cost.qos "
        "(pass --enable-io-cost where the agent owns the cgroup2 root)"
    )
    return Enforcer(
        majmin,
        NONE,
        f"per-device weight not enforced: {why} and scheduler is {sched or 'unknown'}",
    )
