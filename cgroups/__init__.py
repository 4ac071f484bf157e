"""The cgroup v2 library: discovery of the hierarchy and operations on groups, the
registry of cgroup files, CgroupPolicy files and the reconciler that applies them.

Usable on its own as `xhagent.cgroups`.
"""

from .delegation import AGENT_LEAF, DelegationError, Placement  # noqa: E402 - builds on .subtree
from .group import Cgroup, CgroupError
from .mounts import CGROUP2_SUPER_MAGIC, Mount, discover_hierarchy, fs_magic, parse_mountinfo
from .policy import CgroupPolicy, load_policy, load_policy_text
from .reconcile import Actual, Options, Plan, plan
from .spawn import Spawned, SpawnError, signal_process, spawn_method
from .state import ApplyReport, apply, read_actual
from .stats import read_stats
from .subtree import DEFAULT_SUBTREE, Subtree, locate

__all__ = [
    "AGENT_LEAF",
    "CGROUP2_SUPER_MAGIC",
    "DEFAULT_SUBTREE",
    "Actual",
    "DelegationError",
    "Placement",
    "ApplyReport",
    "Cgroup",
    "CgroupError",
    "Mount",
    "Options",
    "Plan",
    "CgroupPolicy",
    "SpawnError",
    "Spawned",
    "Subtree",
    "apply",
    "discover_hierarchy",
    "fs_magic",
    "load_policy",
    "load_policy_text",
    "locate",
    "parse_mountinfo",
    "plan",
    "read_actual",
    "read_stats",
    "signal_process",
    "spawn_method",
]
