"""`cases.burst.contract_floor`: what a task costs the node before the agent's own work.

The same N tasks of `true`, each with everything the agent promises a task on this node and
nothing else: a fresh leaf in a scratch subtree with its class's weights, a supervisor from
the agent's shim server (the executor's own code: `Executor.launch`), its `started` and
fsynced `exit` records and its output files in a state dir on the agent's state disk (its
run directory one of the spares made ahead, as the agent's are, while there are any), its
end seen on the supervisor's pidfd, its record read and its leaf removed; `width` at once,
each free slot filled as soon as an end is seen, the starts of a round sent together. No
store, no scheduler loop, no API: the agent's tasks/s over this is the share of the node's
pace its own work leaves.
"""

from __future__ import annotations

import select
import shutil
import time
from pathlib import Path

from ..cgroups.mounts import discover_hierarchy
from ..cgroups.subtree import Subtree
from ..daemon.exec import shim
from ..daemon.exec.executor import Executor
from ..daemon.exec.leaf import plan_leaf
from ..daemon.exec.spares import DEFAULT_SPARES
from .local_agent import remove_groups
from .submits import spread_us

BATCH_WEIGHTS = (100, 100)  # cpu.weight, io.weight of the class the burst's tasks get
ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LC_ALL": "C"}
SPARES_FILL_S = 60.0  # the most the spare run directories are waited for


def contract_floor(
    n: int, width: int, state_dir: Path, subtree: str, spares: int = DEFAULT_SPARES
) -> dict:
    """N `true` tasks `width` at a time in `subtree` (made, and removed after), their records
    under `state_dir` (made, and removed after), with a pool of `spares` run directories
    made before they start (0: none). Tasks/s over the whole; `failed`: those whose record
    holds no exit 0."""
    if n < 1 or width < 1:
        raise ValueError(f"tasks and width must be >= 1, not {n} and {width}")
    mount = discover_hierarchy().unified
    if mount is None:
        raise RuntimeError("contract floor: this host has no cgroup2 mount")
    sub = Subtree(Path(mount.path), subtree)
    executor = Executor(sub, state_dir, shim.DEFAULT_LOG_CAP, spares=spares)
    try:
        plan = plan_leaf(
            cpus=(), mems=(), memory=None, weights=BATCH_WEIGHTS, missing=executor.prepare()
        )
        spares = executor.spares.fill(SPARES_FILL_S)  # as the agent's, idle before a burst
        live: dict[int, tuple] = {}  # pidfd (or -1 - i for one already ended) -> (id, shim)
        poller = select.poll()
        started = ended = failed = 0
        runs_us: list[float] = []  # started_ns -> ended_ns of the records, as the agent's
        # started_ns -> when its supervisor's pidfd said it ended: the earliest any agent
        # can see an end, the `exit` record's fsyncs included
        seen_us: list[float] = []
        t0 = time.perf_counter()
        while ended < n:
            launches = []
            while started + len(launches) < n and len(live) + len(launches) < width:
                task_id = f"f{started + len(launches)}"
                launches.append(executor.launch(task_id, 1, plan, ["true"], ENV, None, None, None))
            for launch in launches:
                process = launch.wait().process
                pidfd = process.pidfd if process is not None else None
                key = pidfd if pidfd is not None else -1 - started
                if pidfd is not None:
                    poller.register(pidfd, select.POLLIN)
                live[key] = (launch.task_id, process)
                started += 1
            done = [k for k in live if k < 0] or [fd for fd, _ in poller.poll()]
            seen_ns = time.time_ns()
            for key in done:
                if key >= 0:
                    poller.unregister(key)
                task_id, process = live.pop(key)
                if process is not None:
                    process.poll()  # (lets its pidfd go)
                status = executor.status(task_id, 1)
                end = status.exit
                failed += end is None or end.exit_code != 0
                if end is not None and end.ended_ns and status.started is not None:
                    runs_us.append((end.ended_ns - status.started.started_ns) / 1000)
                    if key >= 0:
                        seen_us.append((seen_ns - status.started.started_ns) / 1000)
                executor.remove_leaf(task_id)
                ended += 1
        seconds = time.perf_counter() - t0
    finally:
        executor.close()
        remove_groups(Path(mount.path) / subtree)
        shutil.rmtree(state_dir, ignore_errors=True)
    return {
        "tasks": n,
        "concurrency": width,
        "seconds": round(seconds, 3),
        "per_s": round(n / seconds, 1),
        **spread_us("run", runs_us),
        **spread_us("seen_run", seen_us),
        "failed": failed,
        "spare_run_dirs": {"ready": spares, "taken": executor.spares.taken},
    }
