"""The daemon's hands: task leaves in the agent's subtree, and the shims that run workloads.

Layout under the subtree (every path through `Subtree.resolve`, so nothing is written
outside it):

    <subtree>/tasks/<id>   one leaf per task: its workload's process tree, its limits
    <subtree>/shims        the shims (outside the task leaves: `cgroup.kill` of a task
                           leaves its shim alive to record the status)
    <state>/tasks/<id>/<attempt>/   the shim's records (`started`, `exit`) and the
                                    attempt's output (`stdout`, `stderr`)
    <state>/spare/                  run directories made beforehand (spares.py): a first
                                    attempt's shim renames one to <state>/tasks/<id>

At `prepare()` the controllers the node has are enabled for the task leaves; the ones it
lacks are reported with the reason (`missing`), for the tasks' `unenforced` lists.
"""

from __future__ import annotations

import errno
import grp
import pwd
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ...cgroups import Cgroup, CgroupError, registry
from ...cgroups.spawn import WORKLOAD_OOM_SCORE_ADJ
from ...cgroups.subtree import Subtree, check_name
from ...cpulist import format_cpulist
from ...trace.ustacks import cgroup_of
from . import shim
from .leaf import CONTROLLERS, LeafPlan
from .shim_server import ShimServer
from .spares import DEFAULT_SPARES, SpareRunDirs

TASKS = "tasks"
SHIMS = "shims"


class Executor:
    def __init__(
        self,
        sub: Subtree,
        state_dir: Path,
        log_cap: int,
        shim_server: Path | None = None,
        spares: int = DEFAULT_SPARES,
    ):
        self.sub = sub
        self.shim_server_at = shim_server  # None: the agent starts its own shim server
        self.runs = state_dir / "tasks"
        self.log_cap = log_cap
        self.spares = SpareRunDirs(state_dir, spares, shim.SHIM)
        self.missing: dict[str, str] = {}
        # scheduler traces of tasks with `trace: true` (tracing.TaskTracer), and where what
        # became of one is told: on_trace(task_id, event kind, message, detail)
        self.tracer = None
        self.on_trace = lambda task_id, kind, message, detail=None: None
        self._dirs: dict[str, Path] = {}  # TASKS, SHIMS: found inside the subtree once
        # The shims' server (shim_server.py), started by prepare(); a start it cannot take
        # spawns a shim of its own.
        self._shim_server: ShimServer | None = None
        # With shim_server: told (reached, why) as it turns reachable or not (set before
        # prepare(), which connects)
        self.on_shim_server = lambda reached, why: None

    # -- setup ----------------------------------------------------------------------------
    def prepare(self) -> dict[str, str]:
        """Create `tasks` and `shims`, enable what the node has for the task leaves; returns
        (and keeps) the controllers that cannot be enforced, each with why."""
        self.runs.mkdir(mode=0o700, parents=True, exist_ok=True)
        root = self.sub.ensure()
        tasks = self.sub.group(TASKS).create(exist_ok=True)
        self.sub.group(SHIMS).create(exist_ok=True)
        try:  # now, not at the first start, which would wait for its exec
            self._shims().start()
        except OSError:  # (Unserved, or no shim at all) each start tries again: one that
            pass  # finds no server spawns its own shim, and says what is missing
        available = set(root.controllers())
        self.missing = {
            c: f"the {c} controller is not available in cgroup2 at {root.path}"
            for c in CONTROLLERS
            if c not in available
        }
        wanted = [c for c in CONTROLLERS if c in available]
        for group in (root, tasks):
            enabled = set(group.subtree_control())
            todo = [c for c in wanted if c not in enabled]
            if not todo:
                continue
            try:
                group.write(registry.SUBTREE_CONTROL.name, " ".join(f"+{c}" for c in todo))
            except CgroupError as exc:  # e.g. EBUSY: processes in a group that is not a leaf
                for c in todo:
                    self.missing[c] = f"enabling {c} in {group.path}: {exc}"
                wanted = [c for c in wanted if c not in todo]
        return self.missing

    # -- one task ---------------------------------------------------------------------------
    def leaf(self, task_id: str) -> Cgroup:
        """The task's leaf: one checked name below `tasks`, which was found inside the
        subtree once (a cgroup2 tree holds no symlinks to follow out of it later)."""
        return Cgroup(self._dir(TASKS) / check_name(task_id))

    def _dir(self, name: str) -> Path:
        found = self._dirs.get(name)
        if found is None:
            found = self._dirs[name] = self.sub.resolve(name)
        return found

    def run_dir(self, task_id: str, attempt: int) -> Path:
        return self.runs / task_id / str(attempt)

    def start(
        self,
        task_id: str,
        attempt: int,
        plan: LeafPlan,
        argv: list[str],
        env: dict[str, str],
        cwd: str | None,
        uid: int | None,
        gid: int | None,
        run_dir: Path | None = None,
        trace: bool = False,
        trace_stacks: str = "none",
    ) -> shim.ShimStarted:
        """Create the leaf with its limits, then start the shim, which starts the workload
        inside the leaf. A failure leaves no leaf behind. `run_dir`: where the shim keeps
        its records and the output (default: the attempt's; a migration's checkpoint hook
        runs in the task's leaf with a directory of its own). `trace`: the leaf's scheduler
        events are recorded from before the workload starts until the leaf is removed, with
        each switch-out's stacks when `trace_stacks` says so (kernel, user or both)."""
        return self.launch(
            task_id,
            attempt,
            plan,
            argv,
            env,
            cwd,
            uid,
            gid,
            run_dir=run_dir,
            trace=trace,
            trace_stacks=trace_stacks,
        ).wait()

    def launch(
        self,
        task_id: str,
        attempt: int,
        plan: LeafPlan,
        argv: list[str],
        env: dict[str, str],
        cwd: str | None,
        uid: int | None,
        gid: int | None,
        run_dir: Path | None = None,
        trace: bool = False,
        trace_stacks: str = "none",
    ) -> Launch:
        """`start` up to the shim spawned: its `started` record is awaited by the result's
        `wait`, which the caller must call (a failure then too leaves no leaf behind)."""
        leaf = self.leaf(task_id)
        # The attempt's own directory (and its task's) the shim makes: a mkdir waits on the
        # state disk's journal, which the shims' fsyncs keep busy, and the loop must not.
        # A trace is written there before the shim starts, a hook's directory is elsewhere.
        made_by_shim = run_dir is None and not trace
        run_dir = run_dir or self.run_dir(task_id, attempt)
        if not made_by_shim:
            try:
                run_dir.mkdir(mode=0o750, parents=True, exist_ok=True)
            except OSError as exc:
                if exc.errno == errno.ENOSPC:
                    raise shim.no_space(exc.filename or run_dir) from None
                raise
        # A fresh group for every start: this kernel SIGKILLs clone3(CLONE_INTO_CGROUP)
        # children of a group that was once written to cgroup.kill (see shim.py).
        leaf.create()
        try:
            for f, value in plan.settings:
                if not (f.optional and not leaf.has(f)):
                    leaf.set(f, value)
            if trace:
                why = (
                    self.tracer.begin(task_id, leaf.path, run_dir, trace_stacks)
                    if self.tracer is not None
                    else "the agent records no traces"
                )
                if why is not None:
                    self.on_trace(task_id, "TraceNotRecorded", f"runs untraced: {why}")
            launched = shim.launch_shim(
                run_dir,
                leaf,
                Cgroup(self._dir(SHIMS)),
                argv,
                env,
                cwd=cwd,
                uid=uid,
                gid=gid,
                log_cap=self.log_cap,
                keep_free=shim.AGENT_RESERVE,
                server=self._shims(),
                oom_score_adj=WORKLOAD_OOM_SCORE_ADJ,
                spare=self.spares.take() if made_by_shim and attempt == 1 else None,
            )
        except BaseException:
            self.remove_leaf(task_id)
            raise
        return Launch(self, task_id, launched)

    def _shims(self) -> ShimServer:
        if self._shim_server is None:
            self._shim_server = ShimServer(
                Cgroup(self._dir(SHIMS)), shim.shim_path(), at=self.shim_server_at
            )
            self._shim_server.on_reach = lambda reached, why: self.on_shim_server(reached, why)
        return self._shim_server

    def close(self) -> None:
        """The shims' server ends; the shims it started go on supervising their workloads."""
        if self._shim_server is not None:
            self._shim_server.close()
            self._shim_server = None
        self.spares.close()

    def status(self, task_id: str, attempt: int) -> shim.ShimStatus:
        return shim.read_status(self.run_dir(task_id, attempt))

    def shim_alive(self, started: shim.ShimStarted) -> bool:
        """Whether the shim a `started` record names still runs (its pid not reused)."""
        return shim.process_alive(started.shim_pid, started.shim_start_time)

    def oom_kills(self, task_id: str) -> int:
        """memory.events oom_kill of the task's leaf (0 without the memory controller)."""
        leaf = self.leaf(task_id)
        try:
            return int(leaf.get(registry.MEMORY_EVENTS).get("oom_kill", 0))
        except (CgroupError, OSError, ValueError):
            return 0

    def kill(self, task_id: str, timeout: float = 2.0) -> None:
        """SIGKILL the task's processes (thawed first: a frozen task dies only once thawed)."""
        leaf = self.leaf(task_id)
        if not leaf.path.is_dir():
            return
        if leaf.read(registry.FREEZE.name).strip() == "1":
            leaf.thaw(timeout)
        if leaf.events().get("populated"):
            leaf.kill(timeout)

    def set_weights(self, task_id: str, cpu_weight: int, io_weight: int) -> None:
        """The leaf's `cpu.weight` and `io.weight` now (a boost, or its class's again); a
        controller the node lacks (`missing`) is left alone."""
        leaf = self.leaf(task_id)
        if "cpu" not in self.missing:
            leaf.set(registry.CPU_WEIGHT, cpu_weight)
        if "io" not in self.missing and leaf.has(registry.IO_WEIGHT):
            leaf.set(registry.IO_WEIGHT, {"default": io_weight})

    def set_cpus(self, task_id: str, cpus: Iterable[int], mems: Iterable[int]) -> None:
        """The leaf's `cpuset.cpus` and `cpuset.mems` now (a frozen task resuming on its
        placement's CPUs); left alone where the node lacks the cpuset controller."""
        if "cpuset" in self.missing:
            return
        leaf = self.leaf(task_id)
        leaf.set(registry.CPUSET_CPUS, format_cpulist(sorted(cpus)))
        if mems := sorted(mems):
            leaf.set(registry.CPUSET_MEMS, format_cpulist(mems))

    def set_frozen(self, task_id: str, frozen: bool, timeout: float = 2.0) -> None:
        """Freeze or thaw the leaf to match the task's record (after a restart)."""
        leaf = self.leaf(task_id)
        if not leaf.path.is_dir():
            return
        if (leaf.read(registry.FREEZE.name).strip() == "1") != frozen:
            leaf.freeze(timeout) if frozen else leaf.thaw(timeout)

    def remove_leaf(self, task_id: str) -> int | None:
        """The leaf removed (its processes killed first); the CPU time it used in all (µs,
        cpu.stat, which the kernel keeps for the processes that left), None where there
        was no leaf or its file could not be read."""
        leaf = self.leaf(task_id)
        used = self.cpu_usage(task_id)
        try:
            leaf.remove(kill_first=True)
        except CgroupError as exc:
            if exc.errno != errno.ENOENT:
                raise
        finally:  # the leaf is empty: its processes' last events are in the ring
            self._end_trace(task_id)
        return used

    def cpu_usage(self, task_id: str) -> int | None:
        """The CPU time the task's leaf has used (µs, cpu.stat usage_usec, which the kernel
        keeps without the cpu controller too); None where it cannot be read."""
        try:
            return int(self.leaf(task_id).get(registry.CPU_STAT)["usage_usec"])
        except (CgroupError, OSError, KeyError, ValueError):
            return None

    def _end_trace(self, task_id: str) -> None:
        """The task's recording ends; the tracer's thread finishes the file and tells."""
        if self.tracer is None:
            return

        def then(done: dict | None, error: OSError | None) -> None:
            if error is not None:
                why = f"the trace could not be finished: {error}"
                self.on_trace(task_id, "TraceNotRecorded", why)
                return
            self.on_trace(
                task_id,
                "TraceRecorded",
                f"{done['events']} events ({done['lost']} lost) in {done['seconds']:.1f}s: "
                f"{done['path']}",
                {k: done[k] for k in ("path", "events", "lost", "seconds")},
            )

        self.tracer.end_later(task_id, then)

    def task_of_pid(self, pid: int, proc: str = "/proc") -> str | None:
        """The task whose leaf holds process `pid` now (by its /proc/PID/cgroup), or None:
        gone, or not in a task's leaf."""
        try:
            with open(f"{proc}/{pid}/cgroup", encoding="utf-8", errors="replace") as f:
                path = cgroup_of(f.read())
        except OSError:
            return None
        prefix = "/" + "/".join(p for p in (self.sub.rel, TASKS) if p) + "/"
        if path is None or not path.startswith(prefix):
            return None
        return path[len(prefix) :].split("/")[0] or None

    def leaves(self) -> list[str]:
        """Task ids that have a leaf now."""
        base = self._dir(TASKS)
        try:
            return sorted(p.name for p in base.iterdir() if p.is_dir())
        except FileNotFoundError:
            return []


@dataclass
class Launch:
    """A task's shim spawned in its leaf, its `started` record not awaited yet."""

    executor: Executor
    task_id: str
    launched: shim.Launched

    def wait(self) -> shim.ShimStarted:
        """The shim's `started` record; what `start_shim` raises, the leaf removed first."""
        try:
            return self.launched.wait()
        except BaseException:
            self.executor.remove_leaf(self.task_id)
            raise


def resolve_run_as(run_as) -> tuple[int, int]:
    """(uid, gid) of a Task's `user`, resolved when it starts (as docs/policies.md says); a name
    this node does not know is the task's failure, not the agent's."""
    user, group = run_as.user, run_as.group
    if isinstance(user, int):
        uid, gid = user, user
    else:
        try:
            entry = pwd.getpwnam(user)
        except KeyError:
            raise ValueError(f"user {user!r}: no such user on this node") from None
        uid, gid = entry.pw_uid, entry.pw_gid
    if isinstance(group, int):
        gid = group
    elif group is not None:
        try:
            gid = grp.getgrnam(group).gr_gid
        except KeyError:
            raise ValueError(f"group {group!r}: no such group on this node") from None
    return uid, gid
