"""`cases.burst` of `xhagent bench agent`: N tasks of `true` at once, beside what the node
does without the agent.

- `clients`: N Submits of one task each from `--clients` threads; `multidoc`: then, once
  those all ended, one Submit of N documents. For each: tasks submitted a second and the
  Submit call's p50/p99 (for `multidoc` the one call), the time from the first Submit to the
  last task's end (the agent's `ended_ns`: its own record, so the List polls that notice the
  end add nothing to the figure), tasks/s over it, each task's queue wait (created_ns ->
  started_ns) and run (started_ns -> ended_ns) p50/p99, the tasks by end state;
- `spawn_floor`: the same N `true` by posix_spawn, as many at once as this process may use
  CPUs, no cgroup, no record: what the node does with no agent (the median of FLOOR_ROUNDS
  rounds);
- `contract_floor`: the same N `true` as tasks with everything the agent promises one on
  this node (a fresh leaf, a supervisor from the shim server, the records on the agent's
  state disk, the end seen on a pidfd) and none of the agent's own work: contract_floor.py;
- `call_floor`: a unary call that does nothing, to grpcio alone and to the agent, as many
  as the Submits and from as many clients: the ceiling of any Submit rate (call_floor.py);
- `systemd_run`: where systemd is PID 1, `systemd-run --wait --collect` of `true` N times,
  `--clients` at once (a transient unit each: the tool an operator would use for a command
  in its own cgroup); elsewhere `measured: false` and why.

`ratios.burst_vs_spawn_floor` is the target's; `ratios.burst_vs_contract_floor` says how much
of the gap between the two is the agent's own. `ratios.burst_submit_vs_call_floor` is the
clients' Submit rate over grpcio's no-op rate, and `targets_met` says whether the Submit
target lies within that floor at all (`burst_submit_target_within_call_floor`).

`burst_ratios` and `burst_met` turn a case's figures into ratios and targets, nothing else.
"""

from __future__ import annotations

import os
import select
import shutil
import statistics
import time
from pathlib import Path

from ..daemon.exec.spares import DEFAULT_SPARES
from .call_floor import call_floor
from .contract_floor import contract_floor
from .submits import spread_us, submit_from_clients, task_doc

TARGETS = {
    "burst_vs_spawn_floor": 0.5,
    "burst_submit_per_s": 3000,
    "burst_submit_p99_us": 10_000,
    "burst_run_p99_us": 5_000,
    "burst_vs_systemd_run": 5,
}
PARTS = ("clients", "multidoc")
POLL_S = 0.05  # how often List is asked whether tasks are still live
SPARES_S = 60.0  # the most a part waits for the agent's spare run directories
# The floor takes a second or two where the parts take a minute: on a shared machine one
# short round can land on a busy moment, so it runs this many rounds and counts the median.
FLOOR_ROUNDS = 3


def part_figures(tasks: list, submit_us: list[float], submit_s: float, first_ns: int) -> dict:
    """A part's figures from its Task records (every one ended), its Submit calls' times
    and the wall clock when the first call began."""
    if any(not t.ended_ns for t in tasks):
        raise ValueError("a task has not ended")
    states: dict[str, int] = {}
    for t in tasks:
        states[t.state] = states.get(t.state, 0) + 1
    started = [t for t in tasks if t.started_ns]  # one that failed to start has no start
    all_ended_s = (max(t.ended_ns for t in tasks) - first_ns) / 1e9
    return {
        "tasks": len(tasks),
        "submit_calls": len(submit_us),
        "submit_tasks_per_s": round(len(tasks) / submit_s, 1),
        **spread_us("submit", submit_us),
        "all_ended_s": round(all_ended_s, 3),
        "tasks_per_s": round(len(tasks) / all_ended_s, 1),
        **spread_us("queue_wait", [(t.started_ns - t.created_ns) / 1000 for t in started]),
        **spread_us("run", [(t.ended_ns - t.started_ns) / 1000 for t in started]),
        "states": dict(sorted(states.items())),
        "failed": len(tasks) - states.get("Succeeded", 0),
    }


def burst_ratios(case: dict) -> dict:
    """Each part's tasks/s over the floor's processes/s, over the contract floor's tasks/s,
    and over systemd-run's runs/s (None where systemd-run was not measured)."""

    def over(base: float) -> dict:
        return {part: round(case[part]["tasks_per_s"] / base, 4) for part in PARTS}

    systemd, calls = case["systemd_run"], case["call_floor"]
    submits = case["clients"]["submit_tasks_per_s"]
    return {
        "burst_vs_spawn_floor": over(case["spawn_floor"]["per_s"]),
        "burst_vs_contract_floor": over(case["contract_floor"]["per_s"]),
        "burst_vs_systemd_run": over(systemd["per_s"]) if systemd["measured"] else None,
        "burst_submit_vs_call_floor": {
            "grpc_alone": round(submits / calls["grpc_alone"]["per_s"], 4),
            "agent_health": round(submits / calls["agent_health"]["per_s"], 4),
        },
    }


def burst_met(case: dict, ratios: dict) -> dict[str, bool]:
    """The targets, each part on its own: a ratio of the floor's pace, a `true`'s run p99,
    every task Succeeded; the Submit rate and p99 from the clients; systemd-run's ratio
    only where it was measured."""
    met: dict[str, bool] = {}
    for part in PARTS:
        figures = case[part]
        run_p99 = figures["run_p99_us"]
        met[f"burst_{part}_vs_spawn_floor"] = (
            ratios["burst_vs_spawn_floor"][part] >= TARGETS["burst_vs_spawn_floor"]
        )
        met[f"burst_{part}_run_p99_us"] = (
            run_p99 is not None and run_p99 < TARGETS["burst_run_p99_us"]
        )
        met[f"burst_{part}_all_succeeded"] = figures["failed"] == 0
        if ratios["burst_vs_systemd_run"] is not None:
            met[f"burst_{part}_vs_systemd_run"] = (
                ratios["burst_vs_systemd_run"][part] >= TARGETS["burst_vs_systemd_run"]
            )
    clients = case["clients"]
    met["burst_submit_per_s"] = clients["submit_tasks_per_s"] >= TARGETS["burst_submit_per_s"]
    met["burst_submit_p99_us"] = clients["submit_p99_us"] < TARGETS["burst_submit_p99_us"]
    # Not targets of the agent's: false says the target lies past what the node does in the
    # same run without the agent's own work: a call that does nothing, from the same
    # clients; a task with all the agent promises one (the contract floor), in its pace and
    # in how soon its end can be seen at all.
    floor = case["call_floor"]["grpc_alone"]["per_s"]
    met["burst_submit_target_within_call_floor"] = floor >= TARGETS["burst_submit_per_s"]
    contract = case["contract_floor"]
    met["burst_spawn_target_within_contract_floor"] = (
        contract["per_s"] / case["spawn_floor"]["per_s"] >= TARGETS["burst_vs_spawn_floor"]
    )
    seen = contract.get("seen_run_p99_us")
    met["burst_run_target_within_contract_floor"] = (
        seen is not None and seen < TARGETS["burst_run_p99_us"]
    )
    return met


def systemd_run_path(
    comm: Path = Path("/proc/1/comm"), which=shutil.which
) -> tuple[str | None, str]:
    """(systemd-run's path, "") where systemd is PID 1 and systemd-run is installed; else
    (None, why not). Without systemd as PID 1 there is no manager to make the units."""
    try:
        pid1 = comm.read_text().strip()
    except OSError as exc:
        return None, f"cannot read {comm}: {exc.strerror}"
    if pid1 != "systemd":
        return None, "systemd is not PID 1"
    path = which("systemd-run")
    return (path, "") if path else (None, "systemd-run is not installed")


def spawn_pool(argv: list[str], runs: int, width: int) -> dict:
    """`argv` (its first word a path) run `runs` times, `width` at once, by posix_spawn
    (stdout to /dev/null); each exit is seen on its pidfd as it happens and the next one
    started at once. Processes/s over the whole; `failed`: those that did not exit 0."""
    if runs < 1 or width < 1:
        raise ValueError(f"runs and width must be >= 1, not {runs} and {width}")
    quiet = [(os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0)]
    poller, live = select.poll(), {}  # pidfd -> pid
    started = failed = 0
    t0 = time.perf_counter()
    try:
        while started < runs or live:
            while started < runs and len(live) < width:
                pid = os.posix_spawn(argv[0], argv, os.environ, file_actions=quiet)
                fd = os.pidfd_open(pid)  # ours until reaped, so never another's
                poller.register(fd, select.POLLIN)
                live[fd] = pid
                started += 1
            for fd, _ in poller.poll():
                poller.unregister(fd)
                os.close(fd)
                _, status = os.waitpid(live.pop(fd), 0)
                failed += os.waitstatus_to_exitcode(status) != 0
    finally:
        for fd, pid in live.items():  # only after an error: reap what was started
            os.close(fd)
            os.waitpid(pid, 0)
    seconds = time.perf_counter() - t0
    return {
        "runs": runs,
        "concurrency": width,
        "seconds": round(seconds, 3),
        "per_s": round(runs / seconds, 1),
        "failed": failed,
    }


def median_round(rounds: list[dict]) -> dict:
    """Rounds of `spawn_pool` as one figure: the median round's pace, each round's beside
    it, the failures of all."""
    paces = [r["per_s"] for r in rounds]
    return {
        **{k: rounds[0][k] for k in ("runs", "concurrency")},
        "rounds": len(rounds),
        "per_s_each": paces,
        "per_s": statistics.median(paces),
        "failed": sum(r["failed"] for r in rounds),
    }


def _live_states() -> list[str]:
    from ..daemon.store.states import TERMINAL, TaskState

    return [s.value for s in TaskState if s not in TERMINAL]


def _ended(client, ids: list[str], timeout: float) -> list:
    """The Task records of `ids` once no task of the agent is live (the scratch agent runs
    nothing else meanwhile), read newest first, page by page."""
    from ..daemon.api.v1 import agent_pb2 as pb

    live, deadline = _live_states(), time.monotonic() + timeout
    while left := client.List(pb.ListRequest(states=live, limit=1)).total:
        if time.monotonic() > deadline:
            raise RuntimeError(f"burst: {left} tasks not ended after {timeout:g} s")
        time.sleep(POLL_S)
    wanted, found, token = set(ids), [], ""
    while True:
        reply = client.List(pb.ListRequest(all=True, limit=1000, page_token=token))
        found += [t for t in reply.tasks if t.id in wanted]
        token = reply.next_page_token
        if len(found) == len(wanted) or not token:
            break
    if len(found) != len(wanted):
        raise RuntimeError(f"burst: {len(wanted) - len(found)} tasks not listed")
    return found


def agent_metric(agent, name: str) -> float | None:
    """One sample of the scratch agent's /metrics: `name`'s value (None: not there)."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(agent.metrics_url(), timeout=10) as r:
        text = r.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return sample.value
    return None


def spares_ready(agent, want: int, timeout: float) -> int:
    """The agent's spare run directories ready, waited for (at most `timeout` seconds)
    until `want` are: a burst arrives at an idle node, whose pool is made up."""
    deadline = time.monotonic() + timeout
    while True:
        ready = int(agent_metric(agent, "xhagent_spare_run_dirs") or 0)
        if ready >= want or time.monotonic() > deadline:
            return ready
        time.sleep(0.2)


def _taken(agent) -> int:
    return int(agent_metric(agent, "xhagent_spare_run_dirs_taken_total") or 0)


def _clients_part(agent, n: int, clients: int) -> dict:
    sent = submit_from_clients(agent, n, clients, "b")
    with agent.client() as c:
        tasks = _ended(c, sent.ids, 120 + n / 5)
    return {
        "clients": clients,
        **part_figures(tasks, sent.latencies_us, sent.wall_s, sent.first_ns),
    }


def _multidoc_part(agent, n: int) -> dict:
    from ..daemon.api.v1 import agent_pb2 as pb

    source = "---\n".join(task_doc(f"bm{i}", ["true"]) for i in range(n))
    with agent.client(timeout=300) as c:
        first_ns, t0 = time.time_ns(), time.perf_counter_ns()
        reply = c.Submit(pb.SubmitRequest(source=source, file_name="burst.yaml"))
        call_us = (time.perf_counter_ns() - t0) / 1000
        tasks = _ended(c, [t.id for t in reply.tasks], 120 + n / 5)
    return {"documents": n, **part_figures(tasks, [call_us], call_us / 1e6, first_ns)}


def burst_case(agent, n: int, clients: int, progress) -> dict:
    """The parts one after the other (each starts when every task before it has ended),
    then the floors and systemd-run with the agent idle."""
    case: dict = {"tasks": n}
    parts = {
        "clients": (f"from {clients} clients, one Submit each", _clients_part, (n, clients)),
        "multidoc": (f"as one Submit of {n} documents", _multidoc_part, (n,)),
    }
    for part, (how, run, args) in parts.items():
        progress(f"burst: the agent's spare run directories made up (at most {SPARES_S:g} s)")
        ready, taken = spares_ready(agent, DEFAULT_SPARES, SPARES_S), _taken(agent)
        progress(f"burst: {n} tasks of true {how}")
        case[part] = run(agent, *args)
        case[part]["spare_run_dirs"] = {"ready": ready, "taken": _taken(agent) - taken}
    true = shutil.which("true")
    if true is None:
        raise RuntimeError("true: not found")
    width = len(os.sched_getaffinity(0))
    progress(f"burst: the floor, {n} true by posix_spawn, {width} at a time, {FLOOR_ROUNDS} times")
    case["spawn_floor"] = median_round([spawn_pool([true], n, width) for _ in range(FLOOR_ROUNDS)])
    floor_at = agent.base / "contract-floor", f"xhagent-bench-floor-{os.getpid()}.slice"
    progress(f"burst: the contract floor without spare run directories, {width} at a time")
    case["contract_floor_without_spares"] = contract_floor(n, width, *floor_at, spares=0)
    progress(f"burst: the contract floor, {n} tasks of true without the agent, {width} at a time")
    case["contract_floor"] = contract_floor(n, width, *floor_at)
    progress(
        f"burst: the call floor, {n} no-op calls from {clients} clients to grpcio alone "
        "and to the agent's Health"
    )
    case["call_floor"] = call_floor(agent, n, clients)
    path, why = systemd_run_path()
    if path is None:
        progress(f"burst: systemd-run not measured: {why}")
        case["systemd_run"] = {"measured": False, "reason": why}
        return case
    progress(f"burst: systemd-run --wait --collect true, {n} times, {clients} at a time")
    argv = [path, "--wait", "--collect", "--quiet", "-p", "CPUWeight=100", true]
    case["systemd_run"] = {"measured": True, **spawn_pool(argv, n, clients)}
    return case
