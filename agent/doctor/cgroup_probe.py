"""cgroups: the mounts and mode, the cgroup2 controllers, and whether the agent can
create a group, start a process inside it, freeze it and kill it (done for real with a
throwaway `sleep`, started inside the group by `Cgroup.spawn`: the item `cgroup.spawn` says
which way this kernel allows, clone3(CLONE_INTO_CGROUP) or the fork-then-join fallback).

The probe group is `doctor-<pid>` in the agent's subtree, found by `cgroups.subtree.locate()`
as `xhagent cgroup` and the daemon find it (the systemd unit cgroup delegated to the agent,
else `xhagent.slice`): the doctor proves the place the agent would write, and its items say
which place and why (`where`). However the doctor ends (an error, SIGINT,
SIGTERM, SIGHUP: the command turns them into exceptions) the sleep is killed and the group
thawed and removed, in a section signals cannot cut. Only SIGKILL can leave one behind: each
run first removes the `doctor-<pid>` groups whose pid no longer exists (nothing else).
"""

from __future__ import annotations

import errno
import os
import re
import subprocess
from pathlib import Path

from ..cgroups import Cgroup, CgroupError, Spawned, registry
from ..cgroups.mounts import discover_hierarchy
from ..cgroups.spawn import spawn_method, spawn_method_reason
from ..cgroups.subtree import Subtree, locate
from ..signals import pid_alive, signals_held
from .report import Item, fail, ok

# The controllers the agent's cgroup policies write to.
WANTED = ("cpu", "cpuset", "io", "memory", "pids")
# cgroup v1 names of the same controllers, where they differ.
V1_NAMES = {"io": "blkio"}
LIFECYCLE = ("cgroup.create", "cgroup.spawn", "cgroup.freeze", "cgroup.kill")


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


_PROBE_GROUP = re.compile(r"doctor-([1-9][0-9]{0,6})")
PID_MAX_LIMIT = 1 << 22  # the kernel's largest pid_max: a larger number is nobody's pid


def _dispose(group: Cgroup) -> None:
    """Kill what is in the group, thaw it, remove it; a group already gone is fine."""
    try:
        if group.events().get("populated"):
            group.kill()
        group.write(registry.FREEZE.name, "0")
        group.remove(kill_first=True)
    except CgroupError as exc:
        if exc.errno != errno.ENOENT:
            raise


def remove_stale(parent: Path) -> list[str]:
    """Remove the probe groups of doctors that are gone (killed with SIGKILL): only groups
    named doctor-<pid> whose pid does not exist. Returns their names."""
    try:
        entries = sorted(parent.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return []
    removed = []
    for path in entries:
        match = _PROBE_GROUP.fullmatch(path.name)
        if (
            not match
            or int(match[1]) > PID_MAX_LIMIT
            or path.is_symlink()
            or not path.is_dir()
            or pid_alive(int(match[1]))
        ):
            continue
        try:
            _dispose(Cgroup(path))
        except CgroupError:
            continue  # still busy (a child group someone made): left as it is
        removed.append(path.name)
    return removed


def _where(sub: Subtree) -> dict[str, str]:
    return {"where": str(sub.path), **({"how": sub.placement.how} if sub.placement else {})}


def _lifecycle_items(sub: Subtree) -> list[Item]:
    """Create <subtree>/doctor-<pid>, start a sleep inside it, freeze, thaw, kill, remove; the
    subtree's directory is removed again if the probe created it and nothing else uses it."""
    parent = sub.root
    where = _where(sub)
    stale = remove_stale(parent.path)
    group = Cgroup(parent.path / f"doctor-{os.getpid()}")
    made_parent = False
    try:
        try:
            parent.create()
            made_parent = True
        except CgroupError as exc:
            if exc.errno != errno.EEXIST:
                raise
        group.create()
    except CgroupError as exc:
        _remove_parent(parent, made_parent)
        return [fail("cgroup.create", str(exc), **where)] + [
            fail(n, "no probe group: " + str(exc)) for n in LIFECYCLE[1:]
        ]
    sleeper = None
    try:
        items = [
            ok(
                "cgroup.create",
                path=str(group.path),
                **where,
                **({"stale_removed": stale} if stale else {}),
            )
        ]
        devnull = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        try:
            with signals_held():  # a stop inside the spawn would leave a sleep that nothing kills
                sleeper = group.spawn(["sleep", "30"], stdin=devnull)
        except CgroupError as exc:
            return items + [
                fail("cgroup.spawn", str(exc), method=spawn_method()),
                fail("cgroup.freeze", "no process in the probe group: " + str(exc)),
                fail("cgroup.kill", "no process in the probe group: " + str(exc)),
            ]
        finally:
            os.close(devnull)
        why = spawn_method_reason()
        detail = {
            "method": sleeper.method,
            "pidfd": sleeper.pidfd is not None,
            **({"fallback_because": why} if why else {}),
        }
        members = group.procs()
        items.append(
            ok("cgroup.spawn", **detail)
            if members == [sleeper.pid]
            else fail(
                "cgroup.spawn",
                f"the sleep (pid {sleeper.pid}) is not what the group holds: {members}",
                **detail,
            )
        )
        return items + _freeze_and_kill(group, sleeper)
    finally:
        try:
            _clean_up(group, parent, made_parent, sleeper)
        except BaseException:  # a signal that got in before the section held them: once more
            _clean_up(group, parent, made_parent, sleeper)
            raise


def _freeze_and_kill(group: Cgroup, sleeper: Spawned) -> list[Item]:
    items = []
    try:
        group.freeze(timeout=2.0)  # thaws back itself on a timeout, an error or a stop
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
    return items


def _clean_up(group: Cgroup, parent: Cgroup, made_parent: bool, sleeper: Spawned | None) -> None:
    with signals_held():
        if sleeper is not None and sleeper.poll() is None:
            sleeper.kill()
            sleeper.wait()
        _dispose(group)
        _remove_parent(parent, made_parent)


def _remove_parent(parent: Cgroup, made_parent: bool) -> None:
    if not made_parent:
        return
    try:
        parent.remove()
    except CgroupError as exc:
        if exc.errno not in (errno.EBUSY, errno.ENOENT):  # another doctor or the agent uses it
            raise


def probe(mountinfo: str = "/proc/self/mountinfo", subtree: str | None = None) -> list[Item]:
    hier = discover_hierarchy(mountinfo)
    v1 = sorted({m.path for m in hier.mounts if m.fstype == "cgroup"})
    items = [
        ok(
            "cgroup.mode",
            mode=hier.mode,
            cgroup2=hier.unified.path if hier.unified else None,
            v1_hierarchies=len(v1),
        )
    ]
    if hier.unified is None:
        reason = f"no cgroup2 mount (mode {hier.mode})"
        return items + [fail(n, reason) for n in ("cgroup.v2", "cgroup.controllers", *LIFECYCLE)]
    root = Cgroup(hier.unified.path)
    items.append(ok("cgroup.v2", path=str(root.path)))
    items.append(_controllers_item(root, hier.v1_controllers))
    try:
        sub = locate(subtree, hierarchy=hier)
    except (CgroupError, ValueError) as exc:  # DelegationError: systemd delegated nothing
        return items + [fail(n, f"no place the agent may write: {exc}") for n in LIFECYCLE]
    except OSError as exc:  # reading /proc/self/cgroup or a delegate mark
        why = f"locating the agent's subtree: {exc.filename or ''}: {exc.strerror}"
        return items + [fail(n, why) for n in LIFECYCLE]
    return items + _lifecycle_items(sub)
