"""Kernel release, privileges and the CPU/NUMA layout the agent schedules on."""

from __future__ import annotations

import os
from pathlib import Path

from ..cpulist import parse_cpulist
from .report import Item, fail, ok

# Capability numbers from linux/capability.h, in order.
CAPABILITIES = """CHOWN DAC_OVERRIDE DAC_READ_SEARCH FOWNER FSETID KILL SETGID SETUID SETPCAP
LINUX_IMMUTABLE NET_BIND_SERVICE NET_BROADCAST NET_ADMIN NET_RAW IPC_LOCK IPC_OWNER SYS_MODULE
SYS_RAWIO SYS_CHROOT SYS_PTRACE SYS_PACCT SYS_ADMIN SYS_BOOT SYS_NICE SYS_RESOURCE SYS_TIME
SYS_TTY_CONFIG MKNOD LEASE AUDIT_WRITE AUDIT_CONTROL SETFCAP MAC_OVERRIDE MAC_ADMIN SYSLOG
WAKE_ALARM BLOCK_SUSPEND AUDIT_READ PERFMON BPF CHECKPOINT_RESTORE""".split()

# What the agent itself uses: cgroup writes and BPF/perf need these.
NEEDED = ("SYS_ADMIN", "BPF", "PERFMON", "SYS_NICE", "KILL")


def decode_caps(mask: int) -> list[str]:
    return [name for bit, name in enumerate(CAPABILITIES) if mask >> bit & 1]


def effective_caps(status: str) -> int:
    for line in status.splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    raise LookupError("no CapEff line in /proc/self/status")


def numa_nodes(sys_root: Path) -> dict[int, list[int]]:
    node_dir = sys_root / "devices/system/node"
    online = node_dir / "online"
    if not online.exists():
        return {}
    return {
        n: parse_cpulist((node_dir / f"node{n}/cpulist").read_text())
        for n in parse_cpulist(online.read_text())
    }


def probe(sys_root: Path = Path("/sys"), proc_root: Path = Path("/proc")) -> list[Item]:
    uts = os.uname()
    items = [ok("kernel", release=uts.release, machine=uts.machine)]

    caps = decode_caps(effective_caps((proc_root / "self/status").read_text()))
    lacking = [c for c in NEEDED if c not in caps]
    # The full set is the common case for a root agent: show what is absent from it.
    detail = {"euid": os.geteuid(), "not_effective": [c for c in CAPABILITIES if c not in caps]}
    if lacking:
        items.append(
            fail("capabilities", "missing " + ", ".join(f"CAP_{c}" for c in lacking), **detail)
        )
    else:
        items.append(ok("capabilities", **detail))

    online = parse_cpulist((sys_root / "devices/system/cpu/online").read_text())
    allowed = sorted(os.sched_getaffinity(0))
    items.append(
        ok(
            "cpus",
            online=len(online),
            allowed=len(allowed),
            list=(sys_root / "devices/system/cpu/online").read_text().strip(),
        )
    )
    nodes = numa_nodes(sys_root)
    if nodes:
        items.append(
            ok("numa", nodes=len(nodes), cpus={f"node{n}": len(c) for n, c in nodes.items()})
        )
    else:
        items.append(
            fail(
                "numa",
                f"{sys_root}/devices/system/node/online missing (kernel without CONFIG_NUMA)",
            )
        )
    return items
