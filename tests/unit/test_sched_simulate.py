"""Workload files, the simulator's reports, `xhagent simulate` and `bench sched` quality."""

import json
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from xhagent.bench import sched as bench
from xhagent.sched import workload
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


@pytest.mark.parametrize(
    "text,where,message",
    [
        (
            "kind: Workload\nspec:\n  classes:\n    - {name: a, rnutime: 5ms}\n",
            "4:17",
            "did you mean 'runtime'",
        ),
        (
            "kind: Workload\nspec:\n  classes:\n    - {name: a, runtime: 5 parsecs}\n",
            "4:26",
            "not a valid duration",
        ),
        (
            "kind: Workload\nspec:\n  classes: [{name: web}]\n"
            "  jobs:\n    - {runtime: 1ms, class: wbe}\n",
            "5:29",
            "did you mean 'web'",
        ),
        (
            "kind: Workload\nspec:\n  classes:\n    - {name: a, priority: 101}\n",
            "4:27",
            "out of range",
        ),
        ("kind: Workload\nspec: {}\n", "2:7", "needs classes or jobs"),
    ],
)
def test_workload_errors_are_located(text, where, message):
    with pytest.raises(SpecError) as err:
        workload.load_workload_text(text, "w.yaml")
    assert str(err.value).startswith(f"w.yaml:{where}: ") and message in str(err.value)


def test_cli_json_and_text(tmp_path):
    runner = CliRunner()
    res = runner.invoke(
        simulate_command,
        [
            "--workload",
            str(EXAMPLES / "workload-inversion.yaml"),
            "--nodes",
            PLAIN_NODES,
            "--algorithm",
            "edf-pic",
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert report["algorithm"] == "edf-pic" and report["deadline_miss_ratio"] == 0.0
    res = runner.invoke(
        simulate_command, ["--workload", MIXED, "--nodes", INVENTORY_NODES, "--algorithm", "fair"]
    )
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
    assert task.migratable is True and job.migratable is True
    unset = from_task(replace(task, migratable=None))
    assert unset.migratable is False  # not moved unless it says so, as in the daemon
    moved = from_task(replace(task, runs_on=("gpu", "tpu")))
    assert moved.runs_on == {"gpu", "tpu"} and job.runs_on == frozenset()


BAD_WORKLOAD = """kind: Workload
spec:
  duration: forever
  classes:
    - {name: a, rate: -1, runtime: 5ms}
    - {name: b, rnutime: 5ms, priority: {values: [1, 2], weights: [0, 0]}}
    - {name: c, runtime: 5ms, deadlineSlack: {min: 2, max: 1000000}}
  jobs:
    - {runtime: 9000h}
"""


def test_every_workload_error_at_once_in_file_order():
    with pytest.raises(SpecError) as err:
        workload.load_workload_text(BAD_WORKLOAD, "w.yaml")
    assert str(err.value).splitlines() == [
        "w.yaml:3:13: spec.duration: 'forever' is not a valid duration: "
        "expected a duration such as 250ms, 1.5s or 1h30m",
        "w.yaml:5:23: spec.classes.0.rate: -1 is out of range 0..1000000000",
        "w.yaml:6:17: unknown field 'spec.classes.1.rnutime' (did you mean 'runtime'?)",
        "w.yaml:6:67: spec.classes.1.priority.weights: at least one weight must be positive",
        "w.yaml:7:60: spec.classes.2.deadlineSlack.max: 1000000 is out of range 1..1000.0",
        "w.yaml:9:17: spec.jobs.0.runtime: '9000h' is out of range 0..365d",
    ]


def _cli(*args):
    return CliRunner().invoke(simulate_command, list(args))


def test_job_and_node_caps_refuse_with_exit_1_and_the_flags_raise_them(tmp_path):
    inf_rate = tmp_path / "w.yaml"
    inf_rate.write_text(
        "kind: Workload\nspec:\n  duration: 1h\n"
        "  classes: [{name: a, rate: 1000000000, runtime: 1ms}]\n"
    )
    res = _cli("--workload", str(inf_rate), "--nodes", PLAIN_NODES, "--max-jobs", "1000")
    assert res.exit_code == 1, res.output
    assert res.stderr == (
        f"xhagent simulate: {inf_rate}: the workload generates more than 1000 jobs (class a among"
        " them); lower its rates or duration, or raise --max-jobs\n"
    )
    res = _cli("--workload", MIXED, "--nodes", PLAIN_NODES, "--max-jobs", "10")
    assert res.exit_code == 1 and "more than 10 jobs" in res.stderr
    nodes = tmp_path / "n.yaml"
    nodes.write_text("nodes:\n" + "".join(f"  - {{name: n{i}, cpus: 1}}\n" for i in range(3)))
    res = _cli(
        "--workload",
        str(EXAMPLES / "workload-inversion.yaml"),
        "--nodes",
        str(nodes),
        "--max-nodes",
        "2",
    )
    assert (
        res.exit_code == 1
        and res.stderr == f"xhagent simulate: {nodes}: 3 nodes, more than --max-nodes 2\n"
    )
    res = _cli(
        "--workload",
        str(EXAMPLES / "workload-inversion.yaml"),
        "--nodes",
        str(nodes),
        "--max-nodes",
        "3",
    )
    assert res.exit_code == 0, res.output
    nodes.write_text(
        "nodes:\n" + "".join(f"  - {{name: n{i}, cpus: 4096, gpus: 64}}\n" for i in range(100))
    )
    res = _cli("--workload", str(EXAMPLES / "workload-inversion.yaml"), "--nodes", str(nodes))
    assert res.exit_code == 1
    assert (
        res.stderr == f"xhagent simulate: {nodes}: 416000 CPUs, GPUs and TPUs in all, "
        f"more than --max-slots 250000\n"
    )


def test_mlq_without_queues_warns_what_it_does_instead():
    res = _cli(
        "--workload",
        str(EXAMPLES / "workload-inversion.yaml"),
        "--nodes",
        PLAIN_NODES,
        "--algorithm",
        "mlq",
        "--json",
    )
    assert res.exit_code == 0
    assert "has no queues:, so mlq uses the default levels hot (affinity tier: hot)" in res.stderr
    assert json.loads(res.stdout)["algorithm"] == "mlq"
    res = _cli(
        "--workload",
        str(EXAMPLES / "workload-hotcold.yaml"),
        "--nodes",
        PLAIN_NODES,
        "--algorithm",
        "mlq",
    )
    assert res.exit_code == 0 and "warning" not in res.stderr


def test_algorithm_help_says_what_each_does():
    out = " ".join(_cli("--help").output.split())
    for phrase in (
        "fifo: arrival order",
        "priority: higher priority first",
        "edf: earliest deadline first",
        "edf-pic: EDF where a job holding a resource",
        "fair: least priority-weighted run time",
        "mlq: the workload's queue levels",
    ):
        assert phrase in out


def test_progress_only_after_a_second_and_on_stderr(monkeypatch):
    from xhagent.sched import simulate as sim

    clock = iter([100.0, 100.5, 101.2, 101.5, 103.3])
    monkeypatch.setattr(sim.time, "monotonic", lambda: next(clock))
    lines = []
    p = sim.Progress(lines.append)
    p(10, 100)
    p(20, 100)
    p(30, 100)
    p(40, 100)
    assert lines == [
        "xhagent simulate: 20 of 100 jobs done (20%), 1 s",
        "xhagent simulate: 40 of 100 jobs done (40%), 3 s",
    ]


def test_every_plain_nodes_error_at_once(tmp_path):
    nodes = tmp_path / "n.yaml"
    nodes.write_text(
        "nodes:\n  - {name: a, cpus: many, gpus: -1}\n"
        "  - {name: b, cpsu: 2}\n  - {name: c, cpus: 2}\n"
    )
    res = _cli("--workload", MIXED, "--nodes", str(nodes))
    assert res.exit_code == 2
    assert res.stderr.splitlines() == [
        f"xhagent simulate: {nodes}:2:21: nodes.0.cpus: expected an integer, got a string",
        f"{nodes}:2:33: nodes.0.gpus: -1 is out of range 0..64",
        f"{nodes}:3:15: unknown field 'nodes.1.cpsu' (did you mean 'cpus'?)",
    ]


@pytest.mark.parametrize(
    "text, lines",
    [
        (
            "kind: Workloda\nspce: 1\n",
            [
                "w.yaml:1:1: missing required field 'spec'",
                "w.yaml:1:7: kind: expected Workload, got 'Workloda'",
                "w.yaml:2:1: unknown field 'spce' (did you mean 'spec'?)",
            ],
        ),
        (
            "kind: Workloda\nspec: 3\n",
            [
                "w.yaml:1:7: kind: expected Workload, got 'Workloda'",
                "w.yaml:2:7: spec: expected a mapping, got an integer",
            ],
        ),
        (
            "kind: Workload\nspec:\n  classes: [5, {name: a, rate: -1}]\n",
            [
                "w.yaml:3:13: spec.classes.0: expected a mapping, got an integer",
                "w.yaml:3:32: spec.classes.1.rate: -1 is out of range 0..1000000000",
            ],
        ),
        (
            "kind: Workload\nspec:\n  classes: [{name: web, rate: -1}]\n  jobs:\n"
            "    - {class: web, runtime: 0ms, priority: 200, deviceType: fpga}\n"
            "    - {class: wbe, runtime: 1ms}\n",
            [
                "w.yaml:3:31: spec.classes.0.rate: -1 is out of range 0..1000000000",
                "w.yaml:5:29: spec.jobs.0.runtime: a runtime must be positive",
                "w.yaml:5:44: spec.jobs.0.priority: 200 is out of range 0..100",
                "w.yaml:5:61: spec.jobs.0.deviceType: 'fpga' is not one of cpu, gpu, tpu",
                "w.yaml:6:15: spec.jobs.1.class: 'wbe' is not one of web (did you mean 'web'?)",
            ],
        ),
    ],
)
def test_workload_structure_errors_are_collected_too(text, lines):
    with pytest.raises(SpecError) as err:
        workload.load_workload_text(text, "w.yaml")
    assert str(err.value).splitlines() == lines


@pytest.mark.parametrize("value", [".inf", ".nan", "-.inf"])
def test_infinite_or_nan_rate_is_a_located_error_not_an_endless_run(tmp_path, value):
    w = tmp_path / "w.yaml"
    w.write_text(f"kind: Workload\nspec:\n  classes: [{{name: a, rate: {value}, runtime: 1ms}}]\n")
    res = _cli("--workload", str(w), "--nodes", PLAIN_NODES)
    assert (
        res.exit_code == 2
        and res.stderr == f"xhagent simulate: {w}:3:29: '{value}' is not a finite number\n"
    )


def test_a_policy_that_orders_the_node_is_what_simulate_runs_unless_told(tmp_path):
    policy = tmp_path / "order.yaml"
    policy.write_text(
        "apiVersion: xh.scheduling/v1\nkind: SchedulingPolicy\nmetadata: {name: order}\n"
        "spec:\n  queueing: {algorithm: fifo}\n  matchRules:\n    - selector: {}\n"
    )
    warned: list[str] = []
    assert simulate(MIXED, PLAIN_NODES, None, 1)["algorithm"] == "edf"
    ordered = simulate(MIXED, PLAIN_NODES, None, 1, policy_path=str(policy), warn=warned.append)
    assert ordered["algorithm"] == "fifo"
    assert ordered == simulate(MIXED, PLAIN_NODES, "fifo", 1, policy_path=str(policy))
    assert not [w for w in warned if "orders the node" in w]
    told = simulate(MIXED, PLAIN_NODES, "edf", 1, policy_path=str(policy), warn=warned.append)
    assert told["algorithm"] == "edf"
    assert warned[-1] == (
        "xhagent simulate: warning: policy 'order' orders the node by fifo; "
        "simulating --algorithm edf instead"
    )
