"""Parsers, validators and formatters for the values cgroup files hold.

A validator takes what a user wrote (YAML scalar) and returns the canonical value, the
same value `parse` returns for the kernel's text of a file that holds it, so comparing
desired and actual is plain equality. Anything invalid raises ValueError with a reason.
"""

from __future__ import annotations

import re
from typing import Any

from .. import fields
from ..cpulist import format_cpulist, parse_cpulist
from ..quantity import MAX_SIZE, SIZE_PATTERN, parse_size

MAX = "max"
PAGE = 4096
WEIGHT_RANGE = (1, 10000)
_CPULIST_RE = re.compile(r"^(\d+(-\d+)?)(,\d+(-\d+)?)*$")
_MAJMIN_RE = re.compile(r"^\d+:\d+$")
_DIGITS = re.compile(r"\s*[0-9]+\s*")  # an integer written as text ("500")

# Each validator below carries `.schema`, what a CgroupPolicy CRD says of its value
# (xhagent.fields): as much of the check as JSON schema can say, never more.


def int_range(lo: int, hi: int):
    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            value = _int(value)
        if not lo <= value <= hi:
            raise ValueError(f"{value} is out of range {lo}..{hi}")
        return value

    check.schema = fields.int_or_string(lo, hi, f"^{_DIGITS.pattern}$")
    return check


def _int(value: Any) -> int:
    if isinstance(value, str) and _DIGITS.fullmatch(value):
        return int(value)
    raise ValueError("expected an integer")


weight = int_range(*WEIGHT_RANGE)


def boolean01(value: Any) -> int:
    """cpu.idle and the like: true/false or 0/1, held as 0 or 1."""
    if value in BOOLEAN01:
        return int(value)
    raise ValueError("expected true, false, 0 or 1")


BOOLEAN01 = (0, 1, "0", "1", True, False)
boolean01.schema = fields.one_of_values(BOOLEAN01)


def bytes_or_max(value: Any, page_round: bool = True) -> int | str:
    """`max` or a size by the agent's one rule (`xhagent.quantity`, as in every other file:
    `4G` is 4 * 10**9 bytes, `4Gi` 4 * 2**30), at most 8 EiB. The value written is the
    number of bytes, so the kernel's own reading of suffixes (memparse: all powers of 1024)
    never applies. Memory limits are held in pages by the kernel, so they read back rounded
    down to a page: the canonical value is rounded the same way."""
    if value == MAX:
        return MAX
    size = parse_size(value, forms="512Mi, 4Gi or max")
    return size - size % PAGE if page_round else size


bytes_or_max.schema = fields.int_or_string(0, MAX_SIZE, f"^{MAX}$|{SIZE_PATTERN}")


def count_or_max(value: Any) -> int | str:
    """pids.max and io.max's iops: `max` or a non-negative integer."""
    if value == MAX:
        return MAX
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return _int(value)


count_or_max.schema = fields.int_or_string(0, None, f"^{MAX}$|^{_DIGITS.pattern}$")


def cpu_max(value: Any) -> tuple[int | str, int]:
    """`max`, `QUOTA` or `QUOTA PERIOD` (microseconds), held as (quota or max, period)."""
    parts = str(value).split()
    if not 1 <= len(parts) <= 2:
        raise ValueError("expected 'max', 'QUOTA' or 'QUOTA PERIOD' in microseconds")
    quota: int | str = MAX if parts[0] == MAX else _int(parts[0])
    period = _int(parts[1]) if len(parts) == 2 else 100_000
    if not 1000 <= period <= 1_000_000:
        raise ValueError(f"period {period} is out of range 1000..1000000 microseconds")
    if quota != MAX and quota < 1000:
        raise ValueError(f"quota {quota} is below the kernel's minimum of 1000 microseconds")
    return quota, period


# An integer is a quota alone; the ranges of the text's numbers are the agent's to check.
cpu_max.schema = fields.int_or_string(1000, None, rf"^\s*({MAX}|[0-9]+)(\s+[0-9]+)?\s*$")


def format_cpu_max(value: tuple[int | str, int]) -> str:
    return f"{value[0]} {value[1]}"


def cpulist(value: Any) -> str:
    """A cpu or node list (`0-3,8`), held in the kernel's compressed form (`0-3,8`)."""
    text = str(value).strip().replace(" ", "")
    if text == "":
        return ""
    if not _CPULIST_RE.match(text):
        raise ValueError("expected a list such as 0-3,8")
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        if hi and int(hi) < int(lo):
            raise ValueError(f"range {part} goes backwards")
    return format_cpulist(parse_cpulist(text))


# The characters of a list; its shape (3-1 goes backwards) is the agent's to check.
cpulist.schema = fields.int_or_string(0, None, r"^[0-9,\s-]*$")


PARTITIONS = ("member", "root", "isolated")


def partition(value: Any) -> str:
    if value not in PARTITIONS:
        raise ValueError(f"expected one of {', '.join(PARTITIONS)}")
    return value


partition.schema = fields.string(enum=PARTITIONS)


def choice(*words: str):
    """One of a few words (io.cost's ctrl=user|auto, model=linear)."""

    def check(value: Any) -> str:
        if value not in words:
            raise ValueError(f"expected {' or '.join(words)}")
        return value

    check.schema = fields.string(enum=words)
    return check


def decimal(lo: int, hi: int):
    """A number with at most two decimals (io.cost.qos percentages): the kernel keeps
    hundredths and reads them back as `95.00`, which parse_scalar makes the float 95.0."""

    def check(value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError("expected a number")
        if not lo <= value <= hi:
            raise ValueError(f"{value} is out of range {lo}..{hi}")
        if round(value, 2) != value:
            raise ValueError("at most two decimals (the kernel keeps hundredths)")
        return round(float(value), 2)

    check.schema = fields.number(lo, hi)
    return check


def majmin(value: str) -> str:
    if not _MAJMIN_RE.match(value):
        raise ValueError("expected MAJ:MIN")
    return value


# -- kernel text ------------------------------------------------------------------------
def parse_scalar(text: str) -> int | float | str:
    text = text.strip()
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        return float(text)  # pressure averages
    except ValueError:
        return text


def parse_flat_keyed(text: str) -> dict[str, int | str]:
    """`key value` lines (cgroup.events, cpu.stat, memory.stat, memory.events)."""
    out: dict[str, int | str] = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key:
            out[key] = parse_scalar(value)
    return out


def parse_nested_keyed(text: str) -> dict[str, dict[str, int | str]]:
    """`name key=value ...` lines (io.stat, io.max, pressure files)."""
    out: dict[str, dict[str, int | str]] = {}
    for line in text.splitlines():
        name, *pairs = line.split()
        out[name] = {k: parse_scalar(v) for k, _, v in (p.partition("=") for p in pairs)}
    return out


def parse_weight_file(text: str) -> dict[str, int]:
    """io.weight / io.bfq.weight: `default N` then `MAJ:MIN W` lines."""
    return {
        key: int(value)
        for key, value in (line.split() for line in text.splitlines() if line.strip())
    }


def format_weight_lines(value: dict[str, int]) -> list[str]:
    return [f"{key} {w}" for key, w in value.items()]


def format_nested_keyed(value: dict[str, dict[str, int | str]]) -> list[str]:
    """`name key=value ...` lines, one per name: io.max, io.cost.model, io.cost.qos."""
    return [
        dev + " " + " ".join(f"{k}={v}" for k, v in limits.items()) for dev, limits in value.items()
    ]


def word(text: str) -> str:
    """The first word: cpuset.cpus.partition reads `root invalid (reason)` when refused."""
    return text.split()[0] if text.split() else ""


def as_number(value: int | str) -> float:
    """For ordering limits: `max` is larger than any number."""
    return float("inf") if value == MAX else float(value)
