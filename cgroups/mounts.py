"""Where the cgroup hierarchies are mounted and which mode the node runs in.

Mounts come from /proc/self/mountinfo; a cgroup2 mount is confirmed with statfs
(CGROUP2_SUPER_MAGIC), not trusted by its name or path.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from dataclasses import dataclass, field
from pathlib import Path

from .. import mountinfo

CGROUP2_SUPER_MAGIC = 0x63677270
CGROUP_SUPER_MAGIC = 0x27E0EB


@dataclass(frozen=True)
class Mount:
    path: str
    fstype: str  # "cgroup2" or "cgroup"
    options: tuple[str, ...] = ()

    @property
    def v1_controllers(self) -> tuple[str, ...]:
        """Controllers a v1 hierarchy holds (its super options minus the generic ones)."""
        generic = {
            "rw",
            "ro",
            "relatime",
            "noatime",
            "nosuid",
            "nodev",
            "noexec",
            "nsdelegate",
            "memory_recursiveprot",
            "clone_children",
            "noprefix",
            "xattr",
            "favordynmods",
        }
        return tuple(
            o
            for o in self.options
            if o not in generic and not o.startswith(("name=", "release_agent="))
        )


@dataclass(frozen=True)
class Hierarchy:
    mounts: tuple[Mount, ...]
    unified: Mount | None = None  # the cgroup2 mount, if any
    mode: str = "legacy"  # unified | hybrid | legacy | none
    v1_controllers: tuple[str, ...] = field(default=())


def parse_mountinfo(text: str) -> list[Mount]:
    return [
        Mount(m.path, m.fstype, m.options)
        for m in mountinfo.parse(text)
        if m.fstype in ("cgroup", "cgroup2")
    ]


def classify(mounts: list[Mount]) -> Hierarchy:
    v2 = [m for m in mounts if m.fstype == "cgroup2"]
    v1 = [m for m in mounts if m.fstype == "cgroup"]
    unified = v2[0] if v2 else None
    controllers = tuple(c for m in v1 for c in m.v1_controllers)
    if unified and not controllers:
        mode = "unified"
    elif unified:
        mode = "hybrid"
    elif v1:
        mode = "legacy"
    else:
        mode = "none"
    return Hierarchy(tuple(mounts), unified, mode, controllers)


class _Statfs(ctypes.Structure):
    # f_type leads struct statfs on every Linux ABI; the rest is room for the kernel to fill.
    _fields_ = [("f_type", ctypes.c_long), ("_rest", ctypes.c_byte * 120)]


_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def fs_magic(path: str | os.PathLike) -> int:
    buf = _Statfs()
    if _libc.statfs(os.fsencode(path), ctypes.byref(buf)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), str(path))
    return buf.f_type & 0xFFFFFFFF


def discover_hierarchy(mountinfo: str | os.PathLike = "/proc/self/mountinfo") -> Hierarchy:
    """The cgroup hierarchies of this mount namespace; a cgroup2 entry whose statfs magic
    is not CGROUP2_SUPER_MAGIC (a stale or faked mount) is dropped."""
    mounts = []
    for m in parse_mountinfo(Path(mountinfo).read_text()):
        if m.fstype == "cgroup2":
            try:
                if fs_magic(m.path) != CGROUP2_SUPER_MAGIC:
                    continue
            except OSError:
                continue
        mounts.append(m)
    return classify(mounts)


def own_cgroup(proc_cgroup: str | os.PathLike = "/proc/self/cgroup") -> str:
    """This process's cgroup2 path (the `0::` line), relative to the cgroup2 root."""
    for line in Path(proc_cgroup).read_text().splitlines():
        if line.startswith("0::"):
            return line[3:]
    raise LookupError(f"{proc_cgroup} has no cgroup2 (0::) entry")
