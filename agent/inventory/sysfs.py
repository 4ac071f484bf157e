"""Small readers of sysfs/procfs files under a root, so a recorded tree can stand in for /sys
and /proc."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..cpulist import parse_cpulist

__all__ = ["LIVE_ROOTS", "Roots", "text", "integer", "cpulist"]


@dataclass(frozen=True)
class Roots:
    sys: Path = Path("/sys")
    proc: Path = Path("/proc")
    dev: Path = Path("/dev")


# This machine's own trees: the readers' default. Frozen, so one instance serves every call.
LIVE_ROOTS = Roots()


def text(path: Path, default: str | None = None) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return default


def integer(path: Path, default: int | None = None) -> int | None:
    value = text(path)
    if not value:
        return default
    word = value.split()[0]
    try:
        return int(word, 16) if word.lower().startswith("0x") else int(word)
    except ValueError:
        return default


def cpulist(path: Path) -> list[int]:
    value = text(path)
    return parse_cpulist(value) if value else []
