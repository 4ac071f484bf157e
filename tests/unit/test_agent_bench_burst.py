"""`xhagent bench agent`'s burst case, its pure parts: percentiles, a part's figures from
Task records, ratios and targets from given figures, where systemd-run can be measured;
and the floor's process pool, run for real (`true` and `false`, a few milliseconds)."""

import shutil

import pytest
from click.testing import CliRunner

from xhagent.bench.agent import bench_agent
from xhagent.bench.burst import (
    TARGETS,
    burst_met,
    burst_ratios,
    median_round,
    part_figures,
    spawn_pool,
    spread_us,
    systemd_run_path,
)
from xhagent.bench.submits import percentile
from xhagent.daemon.api.v1 import agent_pb2 as pb

S = 1_000_000_000  # ns


def test_percentile_is_a_measured_value_by_nearest_rank():
    values = list(range(1, 101))  # 1..100
    assert percentile(values, 0.5) == 51
    assert percentile(values, 0.99) == 100
    assert percentile([7.0], 0.99) == 7.0
    assert percentile([3, 1, 2], 0.0) == 1  # sorted first
    with pytest.raises(ValueError):
        percentile([], 0.5)


def test_spread_of_nothing_is_none_not_zero():
    assert spread_us("run", []) == {"run_p50_us": None, "run_p99_us": None}
    assert spread_us("run", [1.04, 2.0]) == {"run_p50_us": 2.0, "run_p99_us": 2.0}


def task(state, created, started, ended):
    return pb.Task(state=state, created_ns=created, started_ns=started, ended_ns=ended)


def test_part_figures_from_task_records():
    first = 100 * S
    tasks = [
        # created 0.1 s after the first Submit, waited 1 s, ran 2 ms
        task("Succeeded", first + S // 10, first + 11 * S // 10, first + 11 * S // 10 + 2_000_000),
        task("Succeeded", first + S // 10, first + 3 * S, first + 3 * S + 4_000_000),
        task("Failed", first + S // 5, 0, first + 4 * S),  # never started: no wait nor run
    ]
    got = part_figures(tasks, [1000.0, 3000.0], 0.5, first)
    assert got["tasks"] == 3 and got["submit_calls"] == 2
    assert got["submit_tasks_per_s"] == 6.0  # 3 tasks in 0.5 s
    assert got["submit_p50_us"] == 3000.0 and got["submit_p99_us"] == 3000.0
    assert got["all_ended_s"] == 4.0  # the first Submit to the last end
    assert got["tasks_per_s"] == 0.8
    assert got["queue_wait_p50_us"] == 2_900_000.0 and got["queue_wait_p99_us"] == 2_900_000.0
    assert got["run_p50_us"] == 4000.0 and got["run_p99_us"] == 4000.0
    assert got["states"] == {"Failed": 1, "Succeeded": 2} and got["failed"] == 1


def test_part_figures_refuse_a_task_not_ended():
    with pytest.raises(ValueError, match="not ended"):
        part_figures([task("Running", 1, 2, 0)], [1.0], 1.0, 0)


def case(
    clients_tps=30.0, multidoc_tps=40.0, systemd=None, run_p99=200_000.0, failed=0, calls=2500.0
):
    part = {"run_p99_us": run_p99, "failed": failed}
    return {
        "clients": {
            **part,
            "tasks_per_s": clients_tps,
            "submit_tasks_per_s": 150.0,
            "submit_p99_us": 236_000.0,
        },
        "multidoc": {**part, "tasks_per_s": multidoc_tps},
        "spawn_floor": {"per_s": 2000.0},
        "contract_floor": {"per_s": 300.0, "seen_run_p99_us": 7_000.0},
        "call_floor": {"grpc_alone": {"per_s": calls}, "agent_health": {"per_s": 1500.0}},
        "systemd_run": systemd or {"measured": False, "reason": "systemd is not PID 1"},
    }


def test_ratios_over_the_floor_and_none_without_systemd_run():
    ratios = burst_ratios(case())
    assert ratios == {
        "burst_vs_spawn_floor": {"clients": 0.015, "multidoc": 0.02},
        "burst_vs_contract_floor": {"clients": 0.1, "multidoc": 0.1333},
        "burst_vs_systemd_run": None,
        "burst_submit_vs_call_floor": {"grpc_alone": 0.06, "agent_health": 0.1},
    }
    met = burst_met(case(), ratios)
    # today's figures (issue 33) meet nothing but every task having succeeded
    assert met == {
        "burst_clients_vs_spawn_floor": False,
        "burst_clients_run_p99_us": False,
        "burst_clients_all_succeeded": True,
        "burst_multidoc_vs_spawn_floor": False,
        "burst_multidoc_run_p99_us": False,
        "burst_multidoc_all_succeeded": True,
        "burst_submit_per_s": False,
        "burst_submit_p99_us": False,
        # a no-op call from the same clients ran at 2,500/s: the target is past it
        "burst_submit_target_within_call_floor": False,
        # tasks with none of the agent's work ran at 300/s, 0.15 of the spawn floor, and
        # their ends could be seen 7 ms after their starts at the 99th percentile
        "burst_spawn_target_within_contract_floor": False,
        "burst_run_target_within_contract_floor": False,
    }


def test_targets_at_their_bounds():
    floor = 2000.0
    half = TARGETS["burst_vs_spawn_floor"] * floor
    systemd = {"measured": True, "per_s": 100.0}
    good = case(
        half, half, systemd, run_p99=TARGETS["burst_run_p99_us"] - 1,
        calls=TARGETS["burst_submit_per_s"],
    )  # fmt: skip
    good["clients"]["submit_tasks_per_s"] = TARGETS["burst_submit_per_s"]
    good["clients"]["submit_p99_us"] = TARGETS["burst_submit_p99_us"] - 1
    good["contract_floor"] = {"per_s": half, "seen_run_p99_us": TARGETS["burst_run_p99_us"] - 1}
    ratios = burst_ratios(good)
    assert ratios["burst_vs_systemd_run"] == {"clients": 10.0, "multidoc": 10.0}
    met = burst_met(good, ratios)
    assert all(met.values()) and len(met) == 13, met
    bad = case(half - 1, half, {"measured": True, "per_s": 250.0}, failed=1)
    bad["clients"]["submit_p99_us"] = TARGETS["burst_submit_p99_us"]  # < is the bound
    met = burst_met(bad, burst_ratios(bad))
    assert not met["burst_clients_vs_spawn_floor"] and met["burst_multidoc_vs_spawn_floor"]
    assert not met["burst_clients_vs_systemd_run"]  # 999 / 250 < 5
    assert not met["burst_submit_p99_us"] and not met["burst_clients_all_succeeded"]
    bad["contract_floor"] = {"per_s": half - 1, "seen_run_p99_us": TARGETS["burst_run_p99_us"]}
    met = burst_met(bad, burst_ratios(bad))
    assert not met["burst_spawn_target_within_contract_floor"]
    assert not met["burst_run_target_within_contract_floor"]
    nothing_started = case(run_p99=None)
    assert not burst_met(nothing_started, burst_ratios(nothing_started))["burst_clients_run_p99_us"]


def test_systemd_run_only_where_systemd_is_pid_1(tmp_path):
    comm = tmp_path / "comm"
    comm.write_text("process_api\n")
    assert systemd_run_path(comm) == (None, "systemd is not PID 1")
    comm.write_text("systemd\n")
    assert systemd_run_path(comm, which=lambda _: None) == (None, "systemd-run is not installed")
    found = systemd_run_path(comm, which=lambda name: f"/usr/bin/{name}")
    assert found == ("/usr/bin/systemd-run", "")
    assert systemd_run_path(tmp_path / "absent")[1].startswith("cannot read")


def test_spawn_pool_runs_every_process_and_counts_failures():
    true, false = shutil.which("true"), shutil.which("false")
    got = spawn_pool([true], 20, 3)
    assert got["runs"] == 20 and got["concurrency"] == 3 and got["failed"] == 0
    assert got["per_s"] > 0
    assert spawn_pool([false], 5, 2)["failed"] == 5
    with pytest.raises(ValueError):
        spawn_pool([true], 5, 0)  # a width of 0 would wait for nothing, forever


def test_the_floor_counts_its_median_round_and_every_failure():
    rounds = [
        {"runs": 10, "concurrency": 2, "seconds": 0.1, "per_s": pace, "failed": failed}
        for pace, failed in ((900.0, 0), (300.0, 1), (2000.0, 0))
    ]
    assert median_round(rounds) == {
        "runs": 10,
        "concurrency": 2,
        "rounds": 3,
        "per_s_each": [900.0, 300.0, 2000.0],
        "per_s": 900.0,
        "failed": 1,
    }


@pytest.mark.parametrize(
    "args", [["--burst", "0"], ["--burst", "10001"], ["--clients", "0"], ["--only", "bursts"]]
)
def test_bench_agent_refuses_out_of_range_values_before_running(args):
    res = CliRunner().invoke(bench_agent, args)
    assert res.exit_code == 2 and args[0] in res.output, res.output
