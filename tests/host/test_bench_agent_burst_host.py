"""`xhagent bench agent --only burst` run for real with a small burst: a scratch agent runs
40 `true` tasks from 4 clients and then as one Submit, beside 40 `true` by posix_spawn
(three rounds) and 40 tasks of `true` through the executor alone (the contract floor);
the figures it prints hold together (every task Succeeded, the clocks of bench and agent
agree, percentiles ordered), and systemd-run is measured only where systemd is PID 1."""

import json
from pathlib import Path

import pytest

from xhagent.bench.burst import PARTS
from xhagent.cgroups.mounts import discover_hierarchy
from xhagent.daemon.exec.spares import DEFAULT_SPARES

pytestmark = pytest.mark.host

N = 40


@pytest.fixture(scope="module")
def report(run_xhagent):
    res = run_xhagent("bench", "agent", "--only", "burst", "--burst", str(N), "--json", timeout=600)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout), res.stderr  # stdout is the JSON alone


def test_every_task_of_both_parts_succeeded_and_the_figures_hold_together(report):
    out, stderr = report
    case = out["cases"]["burst"]
    assert case["tasks"] == N
    assert case["clients"]["clients"] == 4 and case["clients"]["submit_calls"] == N
    assert case["multidoc"]["documents"] == N and case["multidoc"]["submit_calls"] == 1
    for part in PARTS:
        got = case[part]
        assert got["tasks"] == N and got["states"] == {"Succeeded": N} and got["failed"] == 0
        assert got["all_ended_s"] > 0 and got["tasks_per_s"] > 0
        assert got["tasks_per_s"] == pytest.approx(N / got["all_ended_s"], rel=0.01)
        for figure in ("submit", "queue_wait", "run"):
            p50, p99 = got[f"{figure}_p50_us"], got[f"{figure}_p99_us"]
            assert 0 <= p50 <= p99, (part, figure, got)
        # every task was created after the first Submit and ended by the last end: its
        # wait and its run each fit in that span (the agent's clock and the bench's agree)
        span_us = got["all_ended_s"] * 1e6 + 1000  # the figure is rounded to a millisecond
        assert got["queue_wait_p99_us"] <= span_us and got["run_p99_us"] <= span_us
    assert "burst: 40 tasks of true from 4 clients" in stderr
    assert "burst: 40 tasks of true as one Submit of 40 documents" in stderr


def test_each_part_finds_the_agents_spare_run_directories_made_up_and_takes_them(report):
    out, _ = report
    for part in PARTS:  # the second part's were made again after the first took theirs
        assert out["cases"]["burst"][part]["spare_run_dirs"] == {
            "ready": DEFAULT_SPARES,
            "taken": N,
        }


def test_the_floor_is_measured_in_the_same_run_and_the_ratios_follow_from_it(report):
    out, _ = report
    case = out["cases"]["burst"]
    floor = case["spawn_floor"]
    assert floor["runs"] == N and floor["failed"] == 0 and floor["per_s"] > 0
    assert floor["rounds"] == 3 and sorted(floor["per_s_each"])[1] == floor["per_s"]
    assert floor["concurrency"] >= 1
    ratios = out["ratios"]["burst_vs_spawn_floor"]
    for part in PARTS:
        assert ratios[part] == round(case[part]["tasks_per_s"] / floor["per_s"], 4)
    met = out["targets_met"]
    assert met["burst_clients_all_succeeded"] and met["burst_multidoc_all_succeeded"]
    for key in ("vs_spawn_floor", "run_p99_us"):
        for part in PARTS:
            assert isinstance(met[f"burst_{part}_{key}"], bool)
    assert isinstance(met["burst_submit_per_s"], bool)
    assert isinstance(met["burst_submit_p99_us"], bool)
    assert out["targets"]["burst_vs_spawn_floor"] == 0.5


def test_the_contract_floor_runs_tasks_as_the_agent_does_and_leaves_nothing(report):
    out, stderr = report
    case = out["cases"]["burst"]
    floor = case["contract_floor"]
    width = case["spawn_floor"]["concurrency"]
    assert floor["tasks"] == N and floor["failed"] == 0 and floor["concurrency"] == width
    assert floor["per_s"] == pytest.approx(N / floor["seconds"], rel=0.01)
    assert 0 <= floor["run_p50_us"] <= floor["run_p99_us"] <= floor["seconds"] * 1e6
    # an end is seen after the workload's end, once its record is on the disk
    assert floor["run_p50_us"] < floor["seen_run_p50_us"] <= floor["seen_run_p99_us"]
    met = out["targets_met"]
    assert met["burst_run_target_within_contract_floor"] == (
        floor["seen_run_p99_us"] < out["targets"]["burst_run_p99_us"]
    )
    assert met["burst_spawn_target_within_contract_floor"] == (
        floor["per_s"] / case["spawn_floor"]["per_s"] >= out["targets"]["burst_vs_spawn_floor"]
    )
    ratios = out["ratios"]["burst_vs_contract_floor"]
    for part in PARTS:
        assert ratios[part] == round(case[part]["tasks_per_s"] / floor["per_s"], 4)
    assert f"burst: the contract floor, {N} tasks of true without the agent" in stderr
    # its run directories made ahead, as the agent's; and the same without them
    assert floor["spare_run_dirs"] == {"ready": DEFAULT_SPARES, "taken": N}
    bare = case["contract_floor_without_spares"]
    assert bare["tasks"] == N and bare["failed"] == 0
    assert bare["spare_run_dirs"] == {"ready": 0, "taken": 0}
    root = Path(discover_hierarchy().unified.path)
    assert not list(root.glob("xhagent-bench-floor-*"))  # its scratch subtree removed


def test_systemd_run_is_measured_only_under_systemd(report):
    out, stderr = report
    systemd = out["cases"]["burst"]["systemd_run"]
    if Path("/proc/1/comm").read_text().strip() != "systemd":
        assert systemd == {"measured": False, "reason": "systemd is not PID 1"}
        assert out["ratios"]["burst_vs_systemd_run"] is None
        assert not any(k.endswith("vs_systemd_run") for k in out["targets_met"])
        assert "systemd-run not measured: systemd is not PID 1" in stderr
    else:
        assert systemd["measured"] and systemd["runs"] == N and systemd["failed"] == 0
        assert systemd["concurrency"] == 4 and systemd["per_s"] > 0
        assert isinstance(out["targets_met"]["burst_clients_vs_systemd_run"], bool)


def test_the_call_floor_is_a_real_no_op_call_from_the_same_clients(report):
    out, stderr = report
    case = out["cases"]["burst"]
    floor = case["call_floor"]
    for server in ("grpc_alone", "agent_health"):
        got = floor[server]
        assert got["calls"] == N and got["clients"] == case["clients"]["clients"]
        assert got["per_s"] > 0 and 0 < got["p50_us"] <= got["p99_us"], (server, got)
    # a call that does nothing is never slower than the agent's Submit of a task
    submits = case["clients"]["submit_tasks_per_s"]
    assert floor["grpc_alone"]["per_s"] > submits
    ratios = out["ratios"]["burst_submit_vs_call_floor"]
    assert ratios["grpc_alone"] == round(submits / floor["grpc_alone"]["per_s"], 4)
    assert ratios["agent_health"] == round(submits / floor["agent_health"]["per_s"], 4)
    within = out["targets_met"]["burst_submit_target_within_call_floor"]
    assert within == (floor["grpc_alone"]["per_s"] >= out["targets"]["burst_submit_per_s"])
    assert f"burst: the call floor, {N} no-op calls from 4 clients" in stderr
