"""The cgroup v2 library: discovery of the hierarchy and operations on groups.

Usable on its own as `xhagent.cgroups`.
"""
from .group import Cgroup, CgroupError
from .mounts import CGROUP2_SUPER_MAGIC, Mount, discover, fs_magic, parse_mountinfo

__all__ = ["CGROUP2_SUPER_MAGIC", "Cgroup", "CgroupError", "Mount", "discover", "fs_magic", "parse_mountinfo"]
