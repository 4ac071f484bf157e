"""`xhagent doctor`: a real probe of the node, one item per capability the agent relies on.

Each probe tries the thing (sets up a ring, loads a program, freezes a cgroup) rather
than looking for files. Probes never raise: a probe that crashes becomes a failed item
naming the exception, so the report is always complete.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Iterable

from ..errors import errno_reason
from .report import Item, fail

Probe = Callable[[], Iterable[Item]]
CRASHED = "probe crashed"  # how the reason of a section whose probe raised begins
# Every item a probe reports, in report order (docs/operations.md's table; the host test
# holds a real report to it), less `iopoll.<dev>`, one per block device (item_names).
ITEMS = (
    "kernel",
    "capabilities",
    "cpus",
    "numa",
    "io_uring",
    "io_uring.sqpoll",
    "io_uring.registered_buffers",
    "io_uring.registered_files",
    "io_uring.o_direct",
    "io_uring.ops",
    "iopoll",
    "iopoll.file",
    "ebpf.btf",
    "ebpf.tp_btf_sched_switch",
    "ebpf.ringbuf",
    "ebpf.send_signal_thread",
    "ebpf.sched_trace",
    "ebpf.runqlat",
    "runtime.preempt",
    "cgroup.mode",
    "cgroup.v2",
    "cgroup.controllers",
    "cgroup.create",
    "cgroup.spawn",
    "cgroup.freeze",
    "cgroup.kill",
    "taskstats",
    "taskstats.delayacct",
    "nvml",
)


def item_names(sys_root=None) -> list[str]:
    """The names `--require` takes on this node, without probing anything: ITEMS and an
    `iopoll.<dev>` per block device with a medium (what the shell completes)."""
    from pathlib import Path

    from ..inventory.block import block_devices

    try:
        devices = [f"iopoll.{d.name}" for d in block_devices(Path(sys_root or "/sys"))]
    except OSError:
        devices = []
    at = ITEMS.index("iopoll.file")
    return [*ITEMS[:at], *devices, *ITEMS[at:]]


def _probes(subtree: str | None = None) -> list[tuple[str, Probe]]:
    from functools import partial

    from . import (
        bpf_probe,
        cgroup_probe,
        iopoll_probe,
        nvml_probe,
        runtime_probe,
        system_probe,
        taskstats_probe,
        uring_probe,
    )

    return [
        ("system", system_probe.probe),
        ("io_uring", uring_probe.probe),
        ("iopoll", iopoll_probe.probe),
        ("ebpf", bpf_probe.probe),
        ("runtime", runtime_probe.probe),
        ("cgroup", partial(cgroup_probe.probe, subtree=subtree)),
        ("taskstats", taskstats_probe.probe),
        ("nvml", nvml_probe.probe),
    ]


def run_probes(
    probes: list[tuple[str, Probe]] | None = None, subtree: str | None = None
) -> list[Item]:
    """Every probe's items; the cgroup probe's in `subtree` (the agent's own, discovered,
    when None)."""
    items: list[Item] = []
    for section, probe in probes if probes is not None else _probes(subtree):
        try:
            items.extend(probe())
        except Exception as exc:  # a report, not a crash: name what broke
            last = traceback.extract_tb(exc.__traceback__)[-1]
            what = (
                f"{exc.filename + ': ' if exc.filename else ''}{errno_reason(exc)}"
                if isinstance(exc, OSError) and exc.errno
                else str(exc)
            )  # no "[Errno N]" prefix
            items.append(
                fail(
                    section,
                    f"{CRASHED}: {type(exc).__name__}: {what} "
                    f"({last.filename.rsplit('/', 1)[-1]}:{last.lineno})",
                )
            )
    return items


def required_problems(items: list[Item], required: Iterable[str]) -> tuple[int, list[str]]:
    """For `--require`: the exit status and a message per problem. 2 when a name is no item
    of a complete report (bad input: the valid names are listed); 1 when an item is not ok,
    or is missing because its probe crashed (then no name can be called unknown); else 0."""
    by_name = {i.name: i for i in items}
    crashed = [i for i in items if not i.ok and (i.reason or "").startswith(CRASHED)]
    unknown = [name for name in required if name not in by_name]
    if unknown and not crashed:
        return 2, [
            f"--require {name!r}: no such item; the items are: {', '.join(by_name)}"
            for name in unknown
        ]
    problems = []
    for name in required:
        if name not in by_name:
            problems.append(
                f"required item {name!r} is not in the report: "
                + "; ".join(f"{i.name}: {i.reason}" for i in crashed)
            )
        elif not by_name[name].ok:
            problems.append(f"required item {name!r} is not ok: {by_name[name].reason}")
    return (1 if problems else 0), problems
