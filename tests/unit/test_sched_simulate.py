"""Workload files, the simulator's reports, `xhagent simulate` and `bench sched` quality."""
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from xhagent.sched import bench, workload
from xhagent.sched.job import from_task
from xhagent.sched.simulate import simulate, simulate_command
from xhagent.spec import SpecError

EXAMPLES = Path(__file__).resolve().parents[2] / "configs" / "examples"
MIXED = str(EXAMPLES / "workload-mixed.yaml")
INVENTORY_NODES = str(EXAMPLES / "nodes.yaml")
PLAIN_NODES = str(EXAMPLES / "workload-nodes-plain.yaml")


def test_same_seed_same_report_other_seed_other_arrivals():
    a = simulate(MIXED, INVENTORY_NODES, "edf", seed=7)
    assert a == simulate(MIXED, INVENTORY_NODES, "edf", seed=7)
    b = simulate(MIXED, INVENTORY_NODES, "edf", seed=8)
    assert a["jobs"] != b["jobs"] or a["waiting_ms"] != b["waiting_ms"]


def test_report_has_the_mixed_load_table():
    r = simulate(MIXED, INVENTORY_NODES, "fifo", seed=1)
    assert set(r) >= {"deadline_miss_ratio", "waiting_ms", "preemptions", "utilisation", "classes"}
    assert set(r["waiting_ms"]) == {"p50", "p95", "p99"}
    infer = r["classes"]["video-infer"]
    assert infer["sla_p95_latency_ms"] == 40.0 and infer["sla_error_rate"] == 0.01
    assert 0 <= infer["sla_violation_rate"] <= 1
    assert infer["meets_sla"] == (infer["p95_latency_ms"] <= 40.0 and infer["error_rate"] <= 0.01)
    # rates are scaled to 80% of this node model's CPUs and GPUs
    assert 0.7 < r["utilisation"]["gpu"] < 0.9 and 0.7 < r["utilisation"]["cpu"] < 0.9


@pytest.mark.parametrize("text,where,message", [
    ("kind: Workload\nspec:\n  classes:\n    - {name: a, rnutime: 5ms}\n", "4:17", "did you mean 'runtime'"),
    ("kind: Workload\nspec:\n  classes:\n    - {name: a, runtime: 5 parsecs}\n", "4:26", "not a valid duration"),
    ("kind: Workload\nspec:\n  classes: [{name: web}]\n  jobs:\n    - {runtime: 1ms, class: wbe}\n", "5:29",
     "did you mean 'web'"),
    ("kind: Workload\nspec:\n  classes:\n    - {name: a, priority: 101}\n", "4:27", "out of range"),
    ("kind: Workload\nspec: {}\n", "2:7", "needs classes or jobs"),
])
def test_workload_errors_are_located(text, where, message):
    with pytest.raises(SpecError) as err:
        workload.loads(text, "w.yaml")
    assert str(err.value).startswith(f"w.yaml:{where}: ") and message in str(err.value)


def test_cli_json_and_text(tmp_path):
    runner = CliRunner()
    res = runner.invoke(simulate_command, ["--workload", str(EXAMPLES / "workload-inversion.yaml"),
                                           "--nodes", PLAIN_NODES, "--algorithm", "edf-pic", "--json"])
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert report["algorithm"] == "edf-pic" and report["deadline_miss_ratio"] == 0.0
    res = runner.invoke(simulate_command, ["--workload", MIXED, "--nodes", INVENTORY_NODES, "--algorithm", "fair"])
    assert res.exit_code == 0 and "video-infer" in res.stdout


def test_cli_bad_input_exits_2_with_a_location(tmp_path):
    bad = tmp_path / "w.yaml"
    bad.write_text("kind: Workload\nspec:\n  classes:\n    - {name: a, deviceType: gpu, rate: 5}\n")
    runner = CliRunner()
    res = runner.invoke(simulate_command, ["--workload", str(bad), "--nodes", PLAIN_NODES])
    assert res.exit_code == 2 and "needs a gpu but the nodes have none" in res.stderr
    nodes = tmp_path / "n.yaml"
    nodes.write_text("nodes:\n  - {name: a, cpus: many}\n")
    res = runner.invoke(simulate_command, ["--workload", MIXED, "--nodes", str(nodes)])
    assert res.exit_code == 2 and f"{nodes}:2:21: " in res.stderr
    nodes.write_text("nodes:\n  - name: a\n    numa: 3\n")
    res = runner.invoke(simulate_command, ["--workload", MIXED, "--nodes", str(nodes)])
    assert res.exit_code == 2 and f"{nodes}:3:" in res.stderr and "Traceback" not in res.output


def test_bench_quality_targets_hold():
    q = bench.edf_vs_fifo()
    assert q["ok"] and q["edf_miss_ratio"] <= 0.5 * q["fifo_miss_ratio"]
    p = bench.pic_vs_edf()
    assert p["edf_pic_critical_miss_ratio"] < p["edf_critical_miss_ratio"]


def test_policy_task_maps_to_a_job():
    from xhagent.policy.task import parse_task
    from xhagent.spec import load_file

    task = parse_task(load_file(EXAMPLES / "task-infer.yaml")[0])
    job = from_task(task, submitted_ns=1_000)
    assert (job.name, job.device, job.cls) == ("infer-1", "gpu", "video-ai-infer")
    assert job.deadline_ns == 1_000 + 33_000_000 and job.runtime_ns == 12_500_000
    assert job.priority == 50 and job.affinity["stream"] == "cam-7"
