"""`xhagent doctor`: a real probe of the node, one item per capability the agent relies on.

Each probe tries the thing (sets up a ring, loads a program, freezes a cgroup) rather
than looking for files. Probes never raise: a probe that crashes becomes a failed item
naming the exception, so the report is always complete.
"""
from __future__ import annotations

import traceback
from typing import Callable, Iterable

from .report import Item, errno_reason, fail

Probe = Callable[[], Iterable[Item]]


def _probes() -> list[tuple[str, Probe]]:
    from . import bpf_probe, cgroup_probe, iopoll_probe, nvml_probe, system_probe, uring_probe

    return [
        ("system", system_probe.probe),
        ("io_uring", uring_probe.probe),
        ("iopoll", iopoll_probe.probe),
        ("ebpf", bpf_probe.probe),
        ("cgroup", cgroup_probe.probe),
        ("nvml", nvml_probe.probe),
    ]


def run_probes(probes: list[tuple[str, Probe]] | None = None) -> list[Item]:
    items: list[Item] = []
    for section, probe in probes if probes is not None else _probes():
        try:
            items.extend(probe())
        except Exception as exc:  # a report, not a crash: name what broke
            last = traceback.extract_tb(exc.__traceback__)[-1]
            what = (f"{exc.filename + ': ' if exc.filename else ''}{errno_reason(exc)}"
                    if isinstance(exc, OSError) and exc.errno else str(exc))  # no "[Errno N]" prefix
            items.append(fail(section, f"probe crashed: {type(exc).__name__}: {what} "
                                       f"({last.filename.rsplit('/', 1)[-1]}:{last.lineno})"))
    return items


def missing(items: list[Item], required: Iterable[str]) -> list[str]:
    """Names in `required` that are absent from the report or not ok."""
    by_name = {i.name: i for i in items}
    return [name for name in required if name not in by_name or not by_name[name].ok]
