"""/proc/self/mountinfo: every mount's point, file system type and super options."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

MOUNTINFO = "/proc/self/mountinfo"


@dataclass(frozen=True)
class MountEntry:
    path: str
    fstype: str
    options: tuple[str, ...] = ()  # per-mount then super options, first occurrence kept


def unescape(path: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as octal.
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        path = path.replace(code, char)
    return path


def parse(text: str) -> list[MountEntry]:
    """The mounts in mountinfo order (a later mount on the same point hides an earlier one)."""
    mounts = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, rfields = left.split(), right.split()
        if len(fields) < 6 or len(rfields) < 3:
            continue
        opts = tuple(dict.fromkeys(fields[5].split(",") + rfields[2].split(",")))
        mounts.append(MountEntry(unescape(fields[4]), rfields[0], opts))
    return mounts


def read(path: str = MOUNTINFO) -> list[MountEntry]:
    return parse(Path(path).read_text())
