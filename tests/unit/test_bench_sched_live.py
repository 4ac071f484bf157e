"""`bench sched --live`'s pure parts: the stretched plan, the Task and policy it submits
(read back by the agent's own parsers, and by the simulator's job mapping), and the
figures and ratios both sides are reduced to."""

import json
from pathlib import Path

import pytest

from xhagent.bench import sched_live
from xhagent.bench.sched_live import Done, figures, plan, policy_doc, ratios, task_doc
from xhagent.daemon.loop.submission import parse_submission
from xhagent.policy.policy import parse_policy
from xhagent.sched.job import from_task
from xhagent.sched.workload import load_workload, load_workload_text
from xhagent.spec import load_text

MIXED = Path(__file__).resolve().parents[2] / "configs/examples/workload-mixed.yaml"
SMALL = """
kind: Workload
metadata: {name: small}
spec:
  duration: 2s
  classes:
    - {name: web, rate: 20, runtime: 10ms, deadline: 50ms, priority: 70, resources: [bus]}
    - {name: train, deviceType: gpu, rate: 5, runtime: 100ms}
"""


def test_the_plan_stretches_every_time_and_leaves_out_what_the_node_cannot_run():
    w = load_workload_text(SMALL)
    short, long = plan(w, 2, 2.0, seed=3), plan(w, 2, 10.0, seed=3)
    assert long.stretch == 5.0 and short.stretch == 1.0
    assert long.left_out == {"train": "needs a gpu; this node runs cpu jobs only"}
    assert [j.name for j in long.jobs] == [j.name for j in short.jobs] and long.jobs
    for a, b in zip(short.jobs, long.jobs, strict=True):
        assert b.arrival_ns == a.arrival_ns * 5 and b.runtime_ns == a.runtime_ns * 5
        assert b.deadline_ns - b.arrival_ns == (a.deadline_ns - a.arrival_ns) * 5
        assert b.device == "cpu" and b.holds == frozenset({"bus"}) and b.priority == 70
    assert [j.arrival_ns for j in long.jobs] == sorted(j.arrival_ns for j in long.jobs)


def test_each_job_is_submitted_as_the_task_the_simulator_would_make_of_it():
    p = plan(load_workload(MIXED), 2, 60.0, seed=1)
    for job in p.jobs[:50]:
        (task,) = parse_submission(task_doc(job), "job")
        again = from_task(task, job.arrival_ns)
        assert (again.name, again.cls, again.priority, again.holds, again.runtime_ns) == (
            job.name,
            job.cls,
            job.priority,
            job.holds,
            job.runtime_ns,
        )
        assert again.deadline_ns == job.deadline_ns and task.requests.cpus == 1
        assert task.command[:2] == ("perl", "-e")


def test_a_job_of_a_node_task_class_runs_in_it_and_others_in_the_default():
    inversion = load_workload(MIXED.with_name("workload-inversion.yaml"))
    classes = {}
    for job in plan(inversion, 1, 3.0, seed=1).jobs:
        (task,) = parse_submission(task_doc(job), "job")
        classes[job.name] = (job.cls, task.task_class)
    assert classes == {
        "low": ("batch", "batch"),
        "high": ("latency", "latency"),
        "medium": ("batch", "batch"),
    }
    web = plan(load_workload_text(SMALL), 2, 2.0, seed=3).jobs[0]
    assert web.cls == "web" and "class" not in json.loads(task_doc(web))["spec"]


@pytest.mark.parametrize(
    "wanted, online, used, reserved",
    [(1, "0-3", [0], [1, 2, 3]), (None, "0-3", [0, 1], [2, 3]), (2, "0-1", [0, 1], [])],
)
def test_the_live_node_takes_the_first_cpus_and_reserves_the_rest(
    monkeypatch, wanted, online, used, reserved
):
    monkeypatch.setattr(sched_live.os, "sched_getaffinity", lambda pid: {1, 0})
    assert sched_live.node_cpus(wanted, online) == (used, reserved)
    with pytest.raises(sched_live.TooManyCpus, match="--cpus 3: this process may use 2 CPUs"):
        sched_live.node_cpus(3, online)


@pytest.mark.parametrize("algorithm", sched_live.ALGORITHMS)
def test_the_policy_orders_the_node_by_the_algorithm_and_preempts_by_that_order(algorithm):
    (doc,) = load_text(policy_doc(algorithm), "policy")
    p = parse_policy(doc)
    assert p.queueing.algorithm == algorithm
    assert p.preemption == "queueing"


def test_both_sides_reduce_to_the_same_figures_and_their_ratios():
    sim = figures([Done("a", 0, False), Done("a", 100_000_000, True), Done("b", 10_000_000, False)])
    assert sim["deadline_miss_ratio"] == pytest.approx(1 / 3, abs=1e-4)
    assert sim["classes"]["a"] == {
        "jobs": 2,
        "deadline_miss_ratio": 0.5,
        "waiting_p50_ms": 0.0,
        "waiting_p95_ms": 100.0,
    }
    near = figures([Done("a", 0, False), Done("a", 110_000_000, True), Done("b", 9_000_000, False)])
    r = ratios(sim, near)
    assert r["live_vs_sim_miss_delta"] == 0.0
    assert r["live_vs_sim_class_waiting_p95"] == {"a": 1.1, "b": 0.9}
    assert r["targets_met"]
    far = figures([Done("a", 0, True), Done("a", 200_000_000, True), Done("b", 0, False)])
    r = ratios(sim, far)
    assert r["live_vs_sim_miss_delta"] == pytest.approx(1 / 3, abs=1e-4)
    assert r["live_vs_sim_class_waiting_p95"] == {"a": 2.0, "b": 0.0}
    assert not r["targets_met"]
