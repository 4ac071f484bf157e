"""The delegated subtree: the part of the cgroup2 tree the agent may write to.

Where it is comes from `delegation` (an explicit path, the systemd unit cgroup delegated
to the agent, or `xhagent.slice` under the cgroup2 root). Group names are validated and every
path is resolved (symlinks included) and must stay inside the subtree; the only writes
outside it are the cgroup2 root's controller and io.cost switches, and only when the
caller says the agent owns the root.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .. import fields
from ..quantity import kind_of
from .group import Cgroup, CgroupError
from .mounts import Hierarchy, discover_hierarchy

if TYPE_CHECKING:
    from .delegation import Placement

DEFAULT_SUBTREE = "xhagent.slice"
SYSTEMD_CONTROL = ".control"  # systemd's sub-cgroup of a delegated unit for its own helper commands
NAME_MAX = 255  # bytes in one path component (the kernel's NAME_MAX)
# Matched whole (fullmatch): with match and `$`, "web\n" passed, `$` matching before a
# final newline, and a group name with a newline in it reached mkdir.
_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@-]{0,254}")
_CONTROLLER_PREFIXES = (
    "cgroup",
    "cpu",
    "cpuset",
    "io",
    "memory",
    "pids",
    "hugetlb",
    "rdma",
    "misc",
)


def check_name(name: str) -> str:
    """One path component of a group name; a reason in ValueError otherwise."""
    if not isinstance(name, str):  # `name: 5` in a policy: YAML made it a number
        raise ValueError(f"a group name is text, not {kind_of(name)} (quote it)")
    if name in ("", ".", ".."):
        raise ValueError(f"{name!r} is not a group name")
    if len(name.encode()) > NAME_MAX:
        raise ValueError(f"a group name is at most {NAME_MAX} bytes")
    if not _NAME_RE.fullmatch(name):
        raise ValueError(
            f"{name!r}: a group name is letters, digits and _ . @ - (not starting with . @ or -)"
        )
    if name.split(".")[0] in _CONTROLLER_PREFIXES and "." in name:
        raise ValueError(
            f"{name!r} would clash with the kernel's {name.split('.')[0]}.* interface files"
        )
    return name


# What a CgroupPolicy CRD says of a group name (the clash with interface files is the agent's).
check_name.schema = fields.string(pattern=f"^{_NAME_RE.pattern}$", max_length=NAME_MAX)


def check_group_path(path: str) -> str:
    """A relative group path (`a/b`): every component checked, no absolute path."""
    if path.startswith("/"):
        raise ValueError(f"{path!r}: group paths are relative to the agent's subtree")
    for part in path.split("/"):
        check_name(part)
    return path


@dataclass(frozen=True)
class Subtree:
    mount: Path  # the cgroup2 root
    rel: str  # the subtree, relative to the mount ("" for the root itself)
    placement: Placement | None = None  # how it was chosen; its leaf holds the unit's own processes

    @property
    def agent_leaf(self) -> str:
        return self.placement.leaf if self.placement else ""

    @property
    def path(self) -> Path:
        return self.mount / self.rel if self.rel else self.mount

    @property
    def root(self) -> Cgroup:
        return Cgroup(self.path)

    @property
    def top(self) -> Cgroup:
        return Cgroup(self.mount)

    def resolve(self, group: str) -> Path:
        """The directory of `group` (relative to the subtree; "" is the subtree itself),
        refused with ValueError when it would land outside the subtree."""
        if group:
            check_group_path(group)
            if self.agent_leaf and group.split("/")[0] == self.agent_leaf:
                raise ValueError(
                    f"{group!r}: {self.agent_leaf} holds the agent's own processes, "
                    "not a managed group"
                )
        target = self.path / group if group else self.path
        real_base = Path(os.path.realpath(self.path))
        real = Path(os.path.realpath(target))
        if real != real_base and real_base not in real.parents:
            raise ValueError(f"{group!r} resolves to {real}, outside the subtree {real_base}")
        return target

    def group(self, group: str) -> Cgroup:
        return Cgroup(self.resolve(group))

    def ensure(self) -> Cgroup:
        """The subtree's own directory, created when missing."""
        if not self.path.exists():
            self.root.create()
        return self.root

    def walk(self) -> list[str]:
        """Every existing group below the subtree, parents before children, as relative paths."""
        out: list[str] = []
        if not self.path.is_dir():
            return out

        def visit(path: Path, rel: str) -> None:
            try:  # a group removed meanwhile has no children to list
                children = sorted(p for p in path.iterdir() if p.is_dir() and not p.is_symlink())
            except (FileNotFoundError, NotADirectoryError):
                return
            for child in children:
                # The agent's own leaf, and systemd's `.control` (where it runs ExecStartPost=,
                # ExecReload= and ExecStop= of a delegated unit), are not groups we manage.
                if not rel and child.name in (self.agent_leaf, SYSTEMD_CONTROL):
                    continue
                name = f"{rel}/{child.name}" if rel else child.name
                out.append(name)
                visit(child, name)

        visit(self.path, "")
        return out


def locate(
    subtree: str | None = None,
    hierarchy: Hierarchy | None = None,
    delegated: bool | None = None,
    **discovery,
) -> Subtree:
    """The subtree in this mount namespace's cgroup2 hierarchy (CgroupError if none): `subtree`
    when given, else discovered (delegation.discover_placement; DelegationError where systemd
    owns the tree and delegated nothing to the agent)."""
    from .delegation import discover_placement  # it builds on this module

    hier = hierarchy or discover_hierarchy()
    if hier.unified is None:
        raise CgroupError(2, f"no cgroup2 hierarchy is mounted (mode {hier.mode})")
    mount = Path(hier.unified.path)
    placement = discover_placement(mount, subtree, delegated, **discovery)
    # A discovered unit's cgroup path is the kernel's, not input; a named one was checked
    # by discover_placement before its delegate mark was read.
    if placement.rel and placement.how != "delegated":
        check_group_path(placement.rel)
    return Subtree(mount, placement.rel, placement)


def systemd_manages_root(mount: Path) -> bool:
    """systemd puts PID 1 in init.scope; the agent must then never write the root."""
    return (mount / "init.scope").is_dir()
