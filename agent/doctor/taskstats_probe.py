"""Per-task delay accounting: can the agent read a task's delays, and does the kernel record
the non-CPU ones (block I/O, swap-in, reclaim), or can the agent make it?

`taskstats` asks the kernel for this process's delays over generic netlink, as the metrics
collector does (it needs CONFIG_TASKSTATS and CAP_NET_ADMIN). `taskstats.delayacct` reads
`kernel.task_delayacct`; when it is 0 the probe writes the 0 it read back, which changes
nothing but is refused exactly when the agent's `enable_delayacct()` would be (EPERM without
CAP_SYS_ADMIN, EROFS where /proc/sys is read-only), so "can be enabled" is tried, not guessed.
"""

from __future__ import annotations

import os

from ..metrics.taskstats import (
    DELAYACCT,
    DelayAcct,
    TaskStats,
    TaskStatsError,
    delayacct,
    set_delayacct,
)
from .report import Item, fail, ok

NAME = "taskstats"
DELAYACCT_NAME = "taskstats.delayacct"


def decide(found: DelayAcct, refused: str | None) -> Item:
    """The item from the sysctl's state and, when it is off, why writing it was refused
    (None: the write went through, so the agent can switch it on)."""
    if found.state == "on":
        return ok(DELAYACCT_NAME, state="on", can_enable=True)
    if found.state == "absent":
        return fail(DELAYACCT_NAME, found.reason, state="absent", can_enable=False)
    if refused is None:
        return ok(
            DELAYACCT_NAME,
            state="off",
            can_enable=True,
            because="kernel.task_delayacct is 0 and this process may set it (what"
            " enable_delayacct() does); until it is 1 only CPU delays are counted, and tasks"
            " started while it is 0 never get block I/O, swap-in or reclaim delays",
        )
    return fail(
        DELAYACCT_NAME,
        f"kernel.task_delayacct is 0 and this process may not set it ({refused}): only CPU"
        " delays are counted; set it with `sysctl kernel.task_delayacct=1` or boot with"
        " `delayacct`",
        state="off",
        can_enable=False,
    )


def probe_taskstats() -> Item:
    try:
        with TaskStats() as ts:
            d = ts.delays(os.getpid())
            family = ts.family
    except TaskStatsError as exc:
        return fail(NAME, str(exc))
    return ok(NAME, version=d.version, family=family, cpu_delay_count=d.cpu.count)


def probe_delayacct() -> Item:
    found = delayacct(DELAYACCT)
    refused = None
    if found.state == "off":
        try:
            set_delayacct(False, DELAYACCT)
        except TaskStatsError as exc:
            refused = str(exc)
    return decide(found, refused)


def probe() -> list[Item]:
    return [probe_taskstats(), probe_delayacct()]
