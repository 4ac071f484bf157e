"""cgroups: the mounts and mode, the cgroup2 controllers, and whether the agent can
create a group, freeze it and kill it (done for real with a throwaway `sleep`)."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

from ..cgroups import Cgroup, CgroupError
from ..cgroups.mounts import discover
from ..cgroups.subtree import DEFAULT_SUBTREE
from .report import Item, fail, ok

# The controllers the agent's cgroup policies write to.
WANTED = ("cpu", "cpuset", "io", "memory", "pids")
# cgroup v1 names of the same controllers, where they differ.
V1_NAMES = {"io": "blkio"}
PROBE_PARENT = DEFAULT_SUBTREE


def _controllers_item(root: Cgroup, v1: tuple[str, ...]) -> Item:
    available = root.controllers()
    lacking = [c for c in WANTED if c not in available]
    if not lacking:
        return ok("cgroup.controllers", available=available)
    held = [c for c in lacking if V1_NAMES.get(c, c) in v1]
    why = f"{', '.join(lacking)} not available in cgroup2"
    if held:
        why += f" ({', '.join(held)} held by cgroup v1 hierarchies)"
    return fail("cgroup.controllers", why, available=available)


def _lifecycle_items(root: Path) -> list[Item]:
    """Create <root>/xhagent.slice/doctor-<pid>, run a sleep in it, freeze, thaw, kill,
    remove; the parent is removed again if the probe created it."""
    parent = Cgroup(root / PROBE_PARENT)
    made_parent = not parent.path.exists()
    group = Cgroup(parent.path / f"doctor-{os.getpid()}")
    try:
        if made_parent:
            parent.create()
        group.create()
    except CgroupError as exc:
        return [fail("cgroup.create", str(exc)),
                fail("cgroup.freeze", "no probe group: " + str(exc)),
                fail("cgroup.kill", "no probe group: " + str(exc))]
    items = [ok("cgroup.create", path=str(group.path))]
    sleeper = subprocess.Popen(["sleep", "30"], stdin=subprocess.DEVNULL, close_fds=True)
    try:
        group.add_proc(sleeper.pid)
        try:
            group.freeze(timeout=2.0)
            frozen = group.events().get("frozen")
            group.thaw()
            items.append(ok("cgroup.freeze", frozen=frozen))
        except CgroupError as exc:
            items.append(fail("cgroup.freeze", str(exc)))
        try:
            group.kill(timeout=2.0)
            items.append(ok("cgroup.kill", exit_signal=-sleeper.wait(timeout=2.0)))
        except (CgroupError, subprocess.TimeoutExpired) as exc:
            items.append(fail("cgroup.kill", str(exc)))
    except CgroupError as exc:
        items += [fail("cgroup.freeze", str(exc)), fail("cgroup.kill", str(exc))]
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
            sleeper.wait()
        group.remove()
        if made_parent:
            parent.remove()
    return items


def probe(mountinfo: str = "/proc/self/mountinfo") -> list[Item]:
    hier = discover(mountinfo)
    v1 = sorted({m.path for m in hier.mounts if m.fstype == "cgroup"})
    items = [ok("cgroup.mode", mode=hier.mode, cgroup2=hier.unified.path if hier.unified else None,
                v1_hierarchies=len(v1))]
    if hier.unified is None:
        reason = f"no cgroup2 mount (mode {hier.mode})"
        return items + [fail(n, reason) for n in ("cgroup.v2", "cgroup.controllers", "cgroup.create",
                                                 "cgroup.freeze", "cgroup.kill")]
    root = Cgroup(hier.unified.path)
    items.append(ok("cgroup.v2", path=str(root.path)))
    items.append(_controllers_item(root, hier.v1_controllers))
    return items + _lifecycle_items(root.path)
