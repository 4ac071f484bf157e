"""`xhagent bench sched --live`: the simulator checked against the daemon it predicts.

A workload's jobs (`xhagent simulate`'s format) are generated once for this node's CPUs,
stretched in time so that the workload lasts `--seconds` (arrivals, runtimes and deadlines
alike), then run both ways:
- simulated (`sched.simulator`, the node as one NodeSpec of as many CPU slots), and
- live: each job submitted to a scratch agent at its arrival time, as a Task of one CPU
  with the job's class (`app` label), priority, deadline, estimated runtime and resources,
  whose command burns the job's runtime of CPU time (so that a frozen task resumes with
  the work it had left, as a preempted job does in the simulator). The agent's policy sets
  `spec.queueing` to the algorithm and `preemption: queueing`, the simulator's rule.

Each side is reduced by the same function (`figures`): the deadline-miss ratio and the
waiting time (completion minus arrival minus runtime, preemption included) p50/p95,
overall and per class; `ratios` compares them. Classes whose device type this node lacks
(GPUs, TPUs) cannot run live and are left out of both sides, by name.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from ..cpulist import format_cpulist, parse_cpulist
from ..policy.classes import CLASS_WEIGHTS
from ..sched.job import Job
from ..sched.metrics import percentile
from ..sched.simulator import NodeSpec, Simulation
from ..sched.workload import Workload

ALGORITHMS = ("priority", "edf", "edf-pic")  # run by default: the targets'
CHOICES = (*ALGORITHMS, "fair")  # `--algorithm` may name these
# The agent's preemption rule: its node order's, which displaces a running task ranked
# strictly after the waiting one, as the simulator's preemptive disciplines do.
PREEMPTION = "queueing"
# Jobs a live run submits at most: each is a process and a record of the scratch agent's;
# TooManyJobs past it, before anything starts, whatever the workload's rates.
MAX_JOBS = 20_000
MAX_BOOSTS_SHOWN = 20  # the first boosts' events in the report (all of them counted)
# The targets (host, no cpu controller): live against simulated.
MISS_DELTA = 0.05  # absolute difference of the deadline-miss ratios, at most
P95_BAND = 0.25  # each class's waiting p95 within this share of the simulated one
# A job's CPU time burnt by perl (in every Debian root: perl-base), whose start costs a few
# milliseconds: `times` counts the process's CPU time in clock ticks, frozen while the task
# is. Asked between runs of a busy loop (about half a millisecond), not in one: each ask is
# a system call, and a loop of them alone would spend its time in the kernel.
BURN = "{{ for (1..20000) {{}} my @t = times; redo if $t[0] + $t[1] < {seconds} }}"


class TooManyCpus(ValueError):
    """`--cpus` asks for more CPUs than this process may use."""


def node_cpus(wanted: int | None, online: str | None = None) -> tuple[list[int], list[int]]:
    """(the CPUs the live node runs on: the first `wanted` of this process's, all of them
    for None; the node's other CPUs, which the scratch agent keeps as reserved)."""
    mine = sorted(os.sched_getaffinity(0))
    if wanted is not None and wanted > len(mine):
        raise TooManyCpus(f"--cpus {wanted}: this process may use {len(mine)} CPUs ({mine})")
    used = mine[: wanted or len(mine)]
    if online is None:
        online = Path("/sys/devices/system/cpu/online").read_text()
    return used, [c for c in parse_cpulist(online.strip()) if c not in used]


@dataclass(frozen=True)
class Plan:
    jobs: list[Job]  # stretched, in arrival order
    stretch: float  # the factor applied to every time of the workload
    left_out: dict[str, str]  # class -> why it is not run


@dataclass(frozen=True)
class Done:
    """One job as it ended, on either side."""

    cls: str
    waiting_ns: int
    missed: bool


def plan(w: Workload, cpus: int, seconds: float, seed: int) -> Plan:
    """The workload's jobs for a node of `cpus` CPUs, every time of it multiplied so that
    it lasts `seconds`."""
    left_out = {
        name: f"needs a {c.device}; this node runs cpu jobs only"
        for name, c in w.classes.items()
        if c.device != "cpu"
    }
    runnable = replace(
        w,
        classes={n: c for n, c in w.classes.items() if n not in left_out},
        explicit=[j for j in w.explicit if j.device == "cpu"],
    )
    k = seconds * 1e9 / w.duration_ns
    jobs = [
        replace(
            j,
            arrival_ns=round(j.arrival_ns * k),
            runtime_ns=max(1, round(j.runtime_ns * k)),
            deadline_ns=None
            if j.deadline_ns is None
            else round(j.arrival_ns * k) + round((j.deadline_ns - j.arrival_ns) * k),
        )
        for j in runnable.generate(seed, {"cpu": cpus}, MAX_JOBS)
    ]
    return Plan(sorted(jobs, key=lambda j: (j.arrival_ns, j.name)), k, left_out)


def simulated(p: Plan, cpus: int, algorithm: str, w: Workload, overhead_ns: int = 0) -> list[Done]:
    """The plan simulated; with `overhead_ns`, each job holding its slot that much longer
    than its runtime (what the live node adds), its waiting still counted against the
    runtime alone, as the live side's is."""
    jobs = [replace(j, runtime_ns=j.runtime_ns + overhead_ns) for j in p.jobs]
    outcome = Simulation(jobs, [NodeSpec("live", cpus=cpus)], algorithm, levels=w.levels).run()
    return [Done(r.job.cls, r.waiting_ns + overhead_ns, r.missed) for r in outcome.records]


def figures(done: Iterable[Done]) -> dict:
    done = list(done)
    by_class: dict[str, list[Done]] = {}
    for d in done:
        by_class.setdefault(d.cls, []).append(d)

    def summary(ds: list[Done]) -> dict:
        waits = [d.waiting_ns / 1e6 for d in ds]
        return {
            "jobs": len(ds),
            "deadline_miss_ratio": round(sum(d.missed for d in ds) / len(ds), 4),
            "waiting_p50_ms": round(percentile(waits, 50), 1),
            "waiting_p95_ms": round(percentile(waits, 95), 1),
        }

    return {
        **summary(done),
        "classes": {c: summary(ds) for c, ds in sorted(by_class.items())},
    }


def ratios(sim: dict, live: dict) -> dict:
    """Live against simulated: the miss ratios' difference and each waiting p95's ratio."""

    def over(a: float, b: float) -> float | None:
        return round(a / b, 3) if b else None

    per_class = {
        c: over(live["classes"][c]["waiting_p95_ms"], s["waiting_p95_ms"])
        for c, s in sim["classes"].items()
        if c in live["classes"]
    }
    delta = round(abs(live["deadline_miss_ratio"] - sim["deadline_miss_ratio"]), 4)
    return {
        "live_vs_sim_miss_delta": delta,
        "live_vs_sim_waiting_p95": over(live["waiting_p95_ms"], sim["waiting_p95_ms"]),
        "live_vs_sim_class_waiting_p95": per_class,
        "targets_met": delta <= MISS_DELTA
        and all(r is not None and abs(r - 1) <= P95_BAND for r in per_class.values()),
    }


def task_doc(job: Job) -> str:
    """The job as a Task of one CPU; its deadline after its submission, as the job's is
    after its arrival. A job whose class is one of the node's task classes runs in it
    (its cpu.weight and io.weight, which edf-pic lends to a holder)."""
    spec = {
        "deviceType": "cpu",
        "requests": {"cpus": 1},
        "priority": job.priority,
        "estimatedRuntime": f"{job.runtime_ns}ns",
        "command": ["perl", "-e", BURN.format(seconds=job.runtime_ns / 1e9)],
    }
    if job.deadline_ns is not None:
        spec["deadline"] = f"{job.deadline_ns - job.arrival_ns}ns"
    if job.holds:
        spec["resources"] = sorted(job.holds)
    if job.cls in CLASS_WEIGHTS:
        spec["class"] = job.cls
    doc = {
        "apiVersion": "xh.scheduling/v1",
        "kind": "Task",
        "metadata": {"name": job.name, "labels": {"app": job.cls}},
        "spec": spec,
    }
    return json.dumps(doc)  # (JSON is YAML)


def policy_doc(algorithm: str) -> str:
    return json.dumps(
        {
            "apiVersion": "xh.scheduling/v1",
            "kind": "SchedulingPolicy",
            "metadata": {"name": "bench-live"},
            "spec": {
                "queueing": {"algorithm": algorithm},
                "preemption": PREEMPTION,
                "matchRules": [
                    {"selector": {"matchExpressions": [{"key": "app", "operator": "Exists"}]}}
                ],  # fmt: skip
            },
        }
    )


def live(
    p: Plan, algorithm: str, progress: Callable[[str], None], reserved: list[int] = ()
) -> tuple[list[Done], dict, list[str]]:
    """The plan run by a scratch agent of its own (root: cgroup leaves), `reserved` CPUs
    left out of its node. The jobs, its overheads, and its boosts (the Boosted and
    BoostEnded events' messages, in order)."""
    from ..daemon.api.v1 import agent_pb2 as pb
    from .local_agent import LocalAgent

    base = Path(tempfile.mkdtemp(prefix="xhagent-bench-live-"))
    extra = ()
    if reserved:
        config = base / "agent.yaml"
        config.write_text(f'reservedCpus: "{format_cpulist(reserved)}"\n')
        extra = ("--config", str(config))
    agent = LocalAgent(base, f"xhagent-bench-live-{os.getpid()}.slice", extra=extra)
    (agent.policies / "bench-live.yaml").write_text(policy_doc(algorithm))
    try:
        agent.start()
        sent: dict[str, Job] = {}
        with agent.client() as client:
            t0 = time.monotonic()
            for i, job in enumerate(p.jobs):
                time.sleep(max(0.0, t0 + job.arrival_ns / 1e9 - time.monotonic()))
                reply = client.Submit(pb.SubmitRequest(source=task_doc(job), file_name="job"))
                sent[reply.tasks[0].id] = job
                if i % 100 == 99:
                    progress(f"{algorithm}: {i + 1} of {len(p.jobs)} jobs submitted")
            tasks = _ended(client, set(sent), timeout=max(60.0, p.jobs[-1].arrival_ns / 1e9))
            boosts = [
                f"{e.task_id}: {e.kind}: {e.message}"
                for e in client.Watch(pb.WatchRequest(since_seq=0))
                if e.kind in ("Boosted", "BoostEnded")
            ]
    finally:
        agent.stop()
        agent.remove_subtree()
        shutil.rmtree(base, ignore_errors=True)
    out = []
    for t in tasks:
        job = sent[t.id]
        if t.state != "Succeeded":
            raise RuntimeError(f"{job.name} ({t.id}) ended {t.state}: {t.error or t.exit_code}")
        latency = t.ended_ns - t.created_ns
        missed = job.deadline_ns is not None and latency > job.deadline_ns - job.arrival_ns
        out.append(Done(job.cls, latency - job.runtime_ns, missed))
    return out, overheads(tasks, sent), boosts


def overheads(tasks: list, sent: dict[str, Job]) -> dict:
    """What the live node adds to each job that the simulator does not model: the wait of
    a job started at once (the p50 over all: most start at once at 80%), and a run longer
    than the job's runtime (the command's own start and exit, CPU shared with the agent,
    time frozen, and the agent noticing the end)."""
    starts = [(t.started_ns - t.created_ns) / 1e6 for t in tasks]
    overruns = [(t.ended_ns - t.started_ns - sent[t.id].runtime_ns) / 1e6 for t in tasks]
    return {
        "start_p50_ms": round(percentile(starts, 50), 1),
        "run_over_runtime_p50_ms": round(percentile(overruns, 50), 1),
    }


def _ended(client, ids: set[str], timeout: float) -> list:
    from ..daemon.api.v1 import agent_pb2 as pb

    deadline, found = time.monotonic() + timeout, {}
    while True:
        token, waiting = "", Counter()
        while True:
            reply = client.List(pb.ListRequest(all=True, limit=1000, page_token=token))
            found |= {t.id: t for t in reply.tasks if t.id in ids and t.ended_ns}
            waiting.update(t.state for t in reply.tasks if t.id in ids and not t.ended_ns)
            token = reply.next_page_token
            if not token:
                break
        if len(found) == len(ids):
            return list(found.values())
        if time.monotonic() > deadline:
            states = ", ".join(f"{n} {state}" for state, n in waiting.most_common())
            raise RuntimeError(
                f"{len(ids) - len(found)} jobs not ended {timeout:g} s after the last "
                f"arrival ({states}): the node runs the workload far slower than simulated"
            )
        time.sleep(0.5)


def run(
    w: Workload,
    seconds: float,
    seed: int,
    algorithms: Iterable[str],
    progress,
    cpus: int | None = None,
) -> dict:
    used, reserved = node_cpus(cpus)
    cpus = len(used)
    p = plan(w, cpus, seconds, seed)
    if not p.jobs:
        raise ValueError(f"workload {w.name}: no job this node can run ({p.left_out})")
    out: dict = {
        "benchmark": "sched-live",
        "workload": w.name,
        "seed": seed,
        "cpus": cpus,
        "node_cpus": format_cpulist(used),
        "seconds": seconds,
        "stretch": round(p.stretch, 3),
        "jobs": len(p.jobs),
        "left_out": p.left_out,
        "targets": {
            "live_vs_sim_miss_delta": f"<= {MISS_DELTA}",
            "class_waiting_p95": (f"within {P95_BAND:.0%} of the simulated"),
        },  # fmt: skip
        "algorithms": {},
    }
    for algorithm in algorithms:
        sim = figures(simulated(p, cpus, algorithm, w))
        progress(f"{algorithm}: {len(p.jobs)} jobs over {seconds:g} s on a live agent")
        done, overhead, boosts = live(p, algorithm, progress, reserved)
        got = figures(done) | {"boosts": boosts[:MAX_BOOSTS_SHOWN], "boost_events": len(boosts)}
        extra_ns = round((overhead["start_p50_ms"] + overhead["run_over_runtime_p50_ms"]) * 1e6)
        with_overhead = figures(simulated(p, cpus, algorithm, w, max(0, extra_ns)))
        out["algorithms"][algorithm] = {
            "sim": sim,
            "live": got | {"overheads": overhead},
            "ratios": ratios(sim, got),
            # the simulator told of the live node's own overhead per job: how much of the
            # gap above that overhead explains
            "sim_with_overheads": with_overhead,
            "ratios_with_overheads": ratios(with_overhead, got),
        }
    return out


def main(
    workload_path: Path,
    seconds: float,
    seed: int,
    algorithms: tuple[str, ...],
    cpus: int | None = None,
) -> dict:
    import click

    from ..sched.workload import load_workload

    if os.geteuid() != 0:
        click.echo("xhagent bench sched --live: needs root (a scratch agent)", err=True)
        sys.exit(1)
    w = load_workload(workload_path)
    return run(w, seconds, seed, algorithms or ALGORITHMS, lambda m: click.echo(
        f"bench sched --live: {m}", err=True), cpus)  # fmt: skip
