"""Who may do what through the API: the rules, apart from how callers are known.

Admins (root, the agent's own user, and members of the admin group) may do everything.
Any other caller the socket lets in is a *user*: its tasks run as itself (a task without
`user` runs as the caller; a `user` or `group` the caller is not, is refused), and it may
see, follow, read the output of and cancel only the tasks it submitted. Policies are the
admins' alone, to change and to read.

The kernel's word on the caller is `peers.Caller`; group membership comes from the
node's user database (`Directory`), asked once per uid a minute at most.
"""

from __future__ import annotations

import grp
import os
import pwd
import time
from collections.abc import Callable
from dataclasses import dataclass

from .peers import Caller

DEFAULT_ADMIN_GROUP = "xhagent-admin"
MEMBERSHIP_TTL_S = 60.0


class PermissionDenied(Exception):
    """The caller may not do this; str() says what and why, naming the caller."""


@dataclass(frozen=True)
class Access:
    """A caller and what it is: `admin`, and the groups it may run tasks as."""

    caller: Caller
    admin: bool
    groups: frozenset[int]

    @property
    def uid(self) -> int:
        return self.caller.uid

    def owns(self, owner_uid: int | None) -> bool:
        """May it see or act on a task of `owner_uid` (None: the agent's own, from before
        owners were kept)?"""
        return self.admin or owner_uid == self.caller.uid

    def require_admin(self, what: str) -> None:
        if not self.admin:
            raise PermissionDenied(f"{self.caller} may not {what}: it is for admins only")

    def run_as(self, user, group, name: str) -> tuple[int, int] | None:
        """Whom a task submitted by this caller runs as: None for an admin (its document's
        `user`, resolved when it starts, else the agent's user); for a user, itself, with
        its `group` if it is one of the caller's own. `user`/`group` are the document's
        (a name or an id, or None)."""
        if self.admin:
            return None
        if user is not None and _uid_of(user) != self.uid:
            raise PermissionDenied(
                f"task {name}: user {user}: {self.caller} may submit only tasks that run as "
                f"uid {self.uid}"
            )
        if group is None:
            return self.uid, self.caller.gid
        gid = _gid_of(group)
        if gid not in self.groups:
            raise PermissionDenied(
                f"task {name}: group {group}: {self.caller} is not a member of it"
            )
        return self.uid, gid


class Directory:
    """Decides `Access` for callers from the node's user database: who is an admin, and
    which groups a uid belongs to (its primary, its supplementary, the gid it connected
    with). Lookups are cached per uid for MEMBERSHIP_TTL_S."""

    def __init__(
        self,
        admin_group: str | None = DEFAULT_ADMIN_GROUP,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.admin_group = admin_group
        self._clock = clock
        self._cache: dict[int, tuple[float, frozenset[int]]] = {}

    def access(self, caller: Caller) -> Access:
        groups = self._groups(caller.uid) | {caller.gid}
        admin = caller.uid in (0, os.geteuid()) or (
            (gid := self._admin_gid()) is not None and gid in groups
        )
        return Access(caller, admin, frozenset(groups))

    def _admin_gid(self) -> int | None:
        if not self.admin_group:
            return None
        try:
            return grp.getgrnam(self.admin_group).gr_gid
        except KeyError:
            return None

    def _groups(self, uid: int) -> frozenset[int]:
        now = self._clock()
        hit = self._cache.get(uid)
        if hit is not None and now - hit[0] < MEMBERSHIP_TTL_S:
            return hit[1]
        try:
            entry = pwd.getpwuid(uid)
            groups = frozenset(os.getgrouplist(entry.pw_name, entry.pw_gid))
        except (KeyError, OSError):  # a uid with no name: only the gid it connected with
            groups = frozenset()
        if len(self._cache) > 4096:
            self._cache.clear()
        self._cache[uid] = (now, groups)
        return groups


def _uid_of(user) -> int | None:
    if isinstance(user, int):
        return user
    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        return None


def _gid_of(group) -> int | None:
    if isinstance(group, int):
        return group
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        return None


__all__ = ["DEFAULT_ADMIN_GROUP", "Access", "Directory", "PermissionDenied"]
