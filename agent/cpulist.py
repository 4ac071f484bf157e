"""CPU lists in the kernel's syntax (`0-3,8,10-11`): the one parser and the one formatter.

Ground floor: imports nothing of the agent's packages, so any of them may import it. Used
for sysfs files (`devices/system/cpu/online`, `node*/cpulist`), cpuset files, node files,
the agent config's reservedCpus and what the CLIs print.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["MAX_CPUS", "parse_cpulist", "format_cpulist"]

# CPU ids are below the kernel's NR_CPUS, 8192 on common configs: a bound that keeps a
# cpu list such as "0-1000000000000" from expanding until memory runs out.
MAX_CPUS = 8192
_CPU_RANGE = re.compile(r"([0-9]+)(?:-([0-9]+))?")


def parse_cpulist(text: str) -> list[int]:
    """Kernel cpu-list syntax: `0-3,8,10-11` (and the empty string). ValueError for anything
    else, a reversed range (`5-1`) or a CPU id of MAX_CPUS or more."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        m = _CPU_RANGE.fullmatch(part)
        if not m:
            raise ValueError(f"{part!r} is not a CPU id or a range such as 0-3")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        if lo > hi:
            raise ValueError(f"range {part} is reversed")
        if hi >= MAX_CPUS:
            raise ValueError(f"CPU {hi} is out of range: CPU ids are 0..{MAX_CPUS - 1}")
        cpus.extend(range(lo, hi + 1))
    return cpus


def format_cpulist(ids: Iterable[int], empty: str = "") -> str:
    """CPU (or NUMA node) ids in the kernel's compressed form: [0, 1, 2, 5] -> `0-2,5`;
    duplicates and order do not matter. `empty` is the text for no id at all: the kernel
    writes "" (a cpuset file), people read `none` better (the CLIs pass empty="none")."""
    runs: list[list[int]] = []
    for i in sorted(set(ids)):
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs) or empty
