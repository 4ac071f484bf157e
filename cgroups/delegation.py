"""Which part of the cgroup2 tree is the agent's: discovery of its subtree.

In order: an explicit subtree (`--subtree`) wins; it is a delegated one (with a leaf, as
below) when its manager marked it so, as systemd marks the cgroup of a unit with
`Delegate=` (the packaged `xhagent-workloads.service`, whose cgroup outlives restarts of
the agent's own unit). Else, when the agent's own cgroup is a unit cgroup delegated to it
(systemd `Delegate=yes` marks it with the xattr `trusted.delegate`, and since it can set
`user.*` xattrs also `user.delegate`, to "1"), that cgroup is the subtree and the agent
lives in a leaf child of it; else, when systemd manages the tree, nothing outside the
agent's own cgroup may be written (systemd owns the root and every cgroup it did not
delegate); else the default `xhagent.slice` under the cgroup2 root.

The leaf: a delegated unit cgroup's own processes (the agent, when it runs in that unit;
the unit's holder process, when the subtree is another unit's) are moved into a leaf
child of it, since a cgroup holding processes cannot enable domain controllers for
children (cgroup v2's no-internal-process rule).

`decide_placement` is the pure rule (tested on plain data); `discover_placement` gathers the facts
from /proc, /run and the xattrs; `settle` moves the unit cgroup's own processes into the leaf.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .group import Cgroup
from .mounts import own_cgroup
from .subtree import DEFAULT_SUBTREE, check_group_path, check_name, systemd_manages_root

# systemd's cg_is_delegated(): trusted.* decides when present, user.* otherwise.
DELEGATE_XATTRS = ("trusted.delegate", "user.delegate")
AGENT_LEAF = "agent.leaf"  # where the agent's own processes live inside a delegated unit cgroup
SYSTEMD_RUN_DIR = Path("/run/systemd/system")  # sd_booted(): exists iff systemd is PID 1
_TRUE = (b"1", b"yes", b"y", b"true", b"t", b"on")


class DelegationError(ValueError):
    """The agent may not write where it would have to: the message says what to configure."""


@dataclass(frozen=True)
class Placement:
    rel: str  # the subtree, relative to the cgroup2 root
    how: str  # option | delegated | default
    why: str  # one line for people
    # delegated only: the child of the subtree that the unit cgroup's own processes live in
    # (the agent's, or the holder's of the unit that owns a named subtree)
    leaf: str = ""

    def as_dict(self) -> dict[str, str]:
        return {"how": self.how, "why": self.why, "agent_leaf": self.leaf}


def decide_placement(
    own: str,
    systemd: bool,
    mark: Callable[[str], bool | None],
    subtree: str | None = None,
    delegated: bool | None = None,
    leaf: str = AGENT_LEAF,
) -> Placement:
    """The subtree for a process in cgroup `own` (a /proc/self/cgroup path). `mark(rel)` reads
    the delegate mark of a cgroup (None: the filesystem has no xattrs); `delegated` True/False
    overrides the mark for `own`, never for a named `subtree`. Raises DelegationError where
    systemd owns the tree."""
    check_name(leaf)
    if subtree is not None:
        named = subtree.strip("/")
        if named and mark(named):
            # Its manager delegated it (a unit with Delegate=): that unit's own processes
            # are moved into the leaf before controllers are enabled for its children.
            return Placement(
                named,
                "delegated",
                f"--subtree {subtree} given, marked delegated by its manager "
                "(trusted.delegate or user.delegate = 1)",
                leaf,
            )
        return Placement(named, "option", f"--subtree {subtree or '/'} given")
    rel = own.strip("/")
    parent, _, name = rel.rpartition("/")
    is_marked = (lambda r: delegated) if delegated is not None else mark
    source = (
        "--delegated given"
        if delegated
        else "marked delegated by its manager (trusted.delegate or user.delegate = 1)"
    )
    if parent and name == leaf and is_marked(parent):  # moved into the leaf already
        return Placement(
            parent,
            "delegated",
            f"/{parent} is this agent's unit cgroup, {source}; the agent is in /{rel}",
            leaf,
        )
    if delegated and not rel:
        raise DelegationError(
            "--delegated: this process is in the cgroup2 root, which no manager delegates"
        )
    if rel and is_marked(rel):
        return Placement(rel, "delegated", f"/{rel} is this agent's unit cgroup, {source}", leaf)
    if systemd:
        unread = (
            " (its delegate xattrs cannot be read on this filesystem)"
            if delegated is None and mark(rel) is None
            else ""
        )
        raise DelegationError(
            f"systemd manages this cgroup tree and this process's cgroup /{rel} "
            f"is not delegated to it{unread}: "
            "set Delegate=yes on the agent's unit (its cgroup then becomes the agent's subtree), "
            "or pass --subtree PATH naming a cgroup delegated to the agent"
        )
    return Placement(
        DEFAULT_SUBTREE,
        "default",
        f"no systemd manages the cgroup2 tree: the default {DEFAULT_SUBTREE} "
        "under the cgroup2 root",
    )


def read_delegate_mark(path: str | os.PathLike) -> bool | None:
    """systemd's delegate mark of one cgroup directory; None when the filesystem keeps no xattrs."""
    unsupported = 0
    for name in DELEGATE_XATTRS:
        try:
            return os.getxattr(path, name).strip().lower() in _TRUE
        except OSError as exc:
            if exc.errno == errno.ENODATA:
                continue
            if exc.errno == errno.EOPNOTSUPP:
                unsupported += 1
                continue
            raise
    return None if unsupported == len(DELEGATE_XATTRS) else False


def under_systemd(mount: Path, run_dir: Path = SYSTEMD_RUN_DIR) -> bool:
    """systemd as init (sd_booted), or a systemd init.scope in this cgroup2 tree (a container's)."""
    return systemd_manages_root(mount) or run_dir.is_dir()


def discover_placement(
    mount: Path,
    subtree: str | None = None,
    delegated: bool | None = None,
    leaf: str = AGENT_LEAF,
    proc_cgroup: str | os.PathLike = "/proc/self/cgroup",
    run_dir: Path = SYSTEMD_RUN_DIR,
    reader: Callable[[Path], bool | None] = read_delegate_mark,
) -> Placement:

    def mark(rel: str) -> bool | None:
        # A cgroup outside this mount (another cgroup namespace's view) is nobody's delegation here.
        return reader(mount / rel) if rel and (mount / rel).is_dir() else False

    if subtree is not None:
        # A named subtree is only checked for its mark (the agent's own cgroup does not matter).
        if subtree.strip("/"):
            check_group_path(subtree.strip("/"))  # before it is used as a path under the mount
        return decide_placement("/", False, mark, subtree, delegated, leaf)
    return decide_placement(
        own_cgroup(proc_cgroup), under_systemd(mount, run_dir), mark, None, delegated, leaf
    )


def pending(mount: Path, placement: Placement) -> list[int]:
    """Processes `settle` would move: those in the delegated unit cgroup itself."""
    if not placement.leaf:
        return []
    return Cgroup(mount / placement.rel).procs()


def settle(mount: Path, placement: Placement, rounds: int = 3) -> list[int]:
    """Move every process of the delegated unit cgroup into the leaf (created when missing):
    they are that unit's own (the agent, or the holder of the unit that owns a named
    subtree), never workloads, which live in groups below. Idempotent: nothing moves once
    they are there. A few rounds catch a child forked while the first round ran."""
    if not placement.leaf:
        return []
    unit = Cgroup(mount / placement.rel)
    moved: list[int] = []
    for _ in range(rounds):
        step = unit.move_procs_to(Cgroup(unit.path / placement.leaf))
        moved += step
        if not step:
            break
    return moved
