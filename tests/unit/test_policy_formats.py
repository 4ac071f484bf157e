"""SchedulingPolicy and Task files: the seed's example, located errors, parse -> dump -> parse."""

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from xhagent.node_model import Version
from xhagent.policy.cli import policy as policy_cli
from xhagent.policy.policy import (
    Constraints,
    CpuConstraint,
    GpuConstraint,
    Migration,
    Queueing,
    Rule,
    SchedulingPolicy,
    Topology,
    choose,
    dump_policy,
    parse_policy,
    policy_warnings,
    queueing_in_force,
    tie_warnings,
)
from xhagent.policy.selector import Expression, Selector
from xhagent.policy.task import Deadline, Requests, Task, dump_task, parse_task
from xhagent.policy.units import format_instant, parse_instant_ns
from xhagent.spec import SpecError, load_text

EXAMPLES = Path(__file__).resolve().parents[2] / "configs" / "examples"
GiB = 2**30

SEED_POLICY = SchedulingPolicy(
    name="video-inference-strict",
    rules=(
        Rule(
            Selector((("app", "video-ai-infer"),)),
            Constraints(
                gpu=GpuConstraint(min_cuda_version=Version(12, 2), min_memory_gb=16),
                topology=Topology(rack_affinity="same"),
            ),
        ),
    ),
    priority=95,
)


def policy(text: str) -> SchedulingPolicy:
    return parse_policy(load_text(text, "p.yaml")[0])


def task(text: str) -> Task:
    return parse_task(load_text(text, "t.yaml")[0])


def test_seed_policy_example_means_what_it_says():
    assert policy((EXAMPLES / "video-inference-strict.yaml").read_text()) == SEED_POLICY
    assert SEED_POLICY.preemption == "lower-priority"


def test_issue_minimal_task_and_the_example_task():
    t = task(
        "{apiVersion: xh.scheduling/v1, kind: Task, "
        "metadata: {name: infer-1, labels: {app: video-ai-infer}},"
        " spec: {deviceType: gpu, requests: {gpus: 1}}}"
    )
    assert t == Task("infer-1", "gpu", (("app", "video-ai-infer"),), Requests(gpus=1))
    ex = task((EXAMPLES / "task-infer.yaml").read_text())
    assert ex.requests == Requests(cpus=4, memory=8 * GiB, gpus=1)
    assert ex.deadline == Deadline(33_000_000, relative=True)
    assert (
        ex.estimated_runtime_ns == 12_500_000
        and ex.stream_id == 3
        and ex.memory_layout == "NCHW@64B"
    )


HEAD = "apiVersion: xh.scheduling/v1\nkind: {kind}\nmetadata: {{name: x}}\nspec:\n"


# Mistakes and the located message for each (test_crd.py checks the CRD schema refuses
# the SchedulingPolicy ones it can).
LOCATED_ERRORS = [
    (
        "SchedulingPolicy",
        "  matchRules:\n    - selector: {matchLabels: {app: a}}\n      constraint: []\n",
        "p.yaml:7:7: unknown field 'spec.matchRules.0.constraint' (did you mean 'constraints'?)",
    ),
    (
        "SchedulingPolicy",
        "  matchRules:\n    - selector: {matchLabels: {app: a}}\n  priority: 101\n",
        "p.yaml:7:13: spec.priority: 101 is out of range 0..100",
    ),
    (
        "SchedulingPolicy",
        "  matchRules:\n    - selector: {matchLabels: {app: a}}\n      constraints:\n"
        "        - topology: {rackAffinity: sme}\n",
        "p.yaml:8:36: spec.matchRules.0.constraints.0.topology.rackAffinity: "
        "'sme' is not one of same, spread (did you mean 'same'?)",
    ),
    (
        "SchedulingPolicy",
        "  matchRules:\n    - selector: {matchLabels: {app: a}}\n      constraints:\n"
        "        - hardware: {gpu: {minCudaVersion: '12.2'}}\n"
        "        - hardware: {gpu: {minCudaVersion: '12.4'}}\n",
        "p.yaml:9:44: spec.matchRules.0.constraints.1.hardware.gpu.minCudaVersion: "
        "hardware.gpu.minCudaVersion is already set at line 8",
    ),
    (
        "SchedulingPolicy",
        "  matchRules:\n    - selector: {matchLabels: {app: a}}\n      constraints:\n"
        "        - hardware: {gpu: {minCudaVerison: '12.2'}}\n",
        "p.yaml:8:28: unknown field "
        "'spec.matchRules.0.constraints.0.hardware.gpu.minCudaVerison' "
        "(did you mean 'minCudaVersion'?)",
    ),
    (
        "SchedulingPolicy",
        "  matchRules:\n"
        "    - selector: {matchExpressions: [{key: app, operator: Exists, values: [a]}]}\n",
        "p.yaml:6:74: spec.matchRules.0.selector.matchExpressions.0.values: "
        "operator Exists takes no values",
    ),
    (
        "SchedulingPolicy",
        "  matchRules:\n    - selector: {matchLabels: {app: a}}\n  preemption: always\n",
        "p.yaml:7:15: spec.preemption: "
        "'always' is not one of never, lower-priority, deadline-driven, queueing",
    ),
    (
        "SchedulingPolicy",
        "  matchRules:\n    - selector: {}\n  migration: {hotAbove: 1.5}\n",
        "p.yaml:7:25: spec.migration.hotAbove: 1.5 is out of range 0..1",
    ),
    (
        "SchedulingPolicy",
        "  matchRules:\n    - selector: {}\n  migration: {hotAbove: 0.5, idleBelow: 0.5}\n",
        "p.yaml:7:41: spec.migration.idleBelow: 0.5 is not below hotAbove 0.5",
    ),
    (
        "SchedulingPolicy",
        "  matchRules:\n    - selector: {}\n  migration: {interval: 0}\n",
        "p.yaml:7:25: spec.migration.interval: 0 is out of range 100ms..1h",
    ),
    (
        "SchedulingPolicy",
        "  matchRules:\n    - selector: {}\n  migration: {interval: 1.5}\n",
        "p.yaml:7:25: spec.migration.interval: write 1.5s: a bare number is whole seconds",
    ),
    (
        "SchedulingPolicy",
        "  matchRules:\n    - selector: {}\n  migration: {interval: fast}\n",
        "p.yaml:7:25: spec.migration.interval: 'fast' is not a valid duration: "
        "expected a duration such as 250ms, 1.5s or 1h30m",
    ),
    (
        "SchedulingPolicy",
        "  matchRules:\n    - selector: {}\n  migration: {intervalSeconds: 5}\n",
        "p.yaml:7:15: unknown field 'spec.migration.intervalSeconds' (did you mean 'interval'?)",
    ),
    (
        "SchedulingPolicy",
        "  matchRules:\n    - selector: {}\n  queueing: {algorithm: lifo}\n",
        "p.yaml:7:25: spec.queueing.algorithm: "
        "'lifo' is not one of fifo, priority, edf, edf-pic, fair, mlq, dwps",
    ),
    (
        "SchedulingPolicy",
        "  matchRules:\n    - selector: {}\n  queueing: {algorithm: edf, levels: [{name: hot}]}\n",
        "p.yaml:7:38: spec.queueing.levels: levels are mlq's; edf has none",
    ),
    (
        "SchedulingPolicy",
        "  matchRules:\n    - selector: {}\n"
        "  queueing: {algorithm: mlq, levels: [{name: a}, {name: b}]}\n",
        "p.yaml:7:50: spec.queueing.levels.1: only one level may leave out matchLabels, and "
        "'a' does already (the level of the tasks no other claims)",
    ),
    (
        "SchedulingPolicy",
        "  matchRules:\n    - selector: {}\n"
        "  queueing: {algorithm: mlq, levels: [{name: a}, {name: a, matchLabels: {t: x}}]}\n",
        "p.yaml:7:57: spec.queueing.levels.1.name: level 'a' is declared twice",
    ),
    (
        "SchedulingPolicy",
        "  matchRules:\n    - selector: {}\n  queueing: {algorithm: mlq, levels: []}\n",
        "p.yaml:7:38: spec.queueing.levels: give at least one level",
    ),
    (
        "SchedulingPolicy",
        "  matchRules:\n    - selector: {}\n  queueing: {}\n",
        "p.yaml:7:13: missing required field 'spec.queueing.algorithm'",
    ),
    (
        "SchedulingPolicy",
        "  matchRules:\n    - selector: {}\n  queueing: {algorithm: edf, slice: 5ms}\n",
        "p.yaml:7:30: unknown field 'spec.queueing.slice'",
    ),
    (
        "Task",
        "  deviceType: gpu\n  numThreads: 4\n",
        "t.yaml:6:3: spec.numThreads is only for deviceType cpu (this task is gpu)",
    ),
    (
        "Task",
        "  deviceType: cpu\n  streamId: 1\n",
        "t.yaml:6:3: spec.streamId is only for deviceType gpu or tpu (this task is cpu)",
    ),
    (
        "Task",
        "  deviceType: gpu\n  coreAssignment: [0, 1]\n",
        "t.yaml:6:3: spec.coreAssignment is only for deviceType tpu (this task is gpu)",
    ),
    (
        "Task",
        "  deviceType: cpu\n  requests: {cpus: 2, gpus: 1}\n",
        "t.yaml:6:23: spec.requests.gpus is only for deviceType gpu (this task is cpu)",
    ),
    (
        "Task",
        "  deviceType: cpu\n  deadline: 5 parsecs\n",
        "t.yaml:6:13: spec.deadline: '5 parsecs' is not a valid deadline "
        "(a duration such as 250ms or an RFC 3339 time): "
        "expected a duration such as 250ms, 1.5s or 1h30m",
    ),
    (
        "Task",
        "  deviceType: fpga\n",
        "t.yaml:5:15: spec.deviceType: 'fpga' is not one of cpu, gpu, tpu",
    ),
    (
        "Task",
        "  deviceType: cpu\n  computeGraphHash: abc\n",
        "t.yaml:6:21: spec.computeGraphHash: expected a SHA-256 digest, 64 lowercase hex digits",
    ),
]


@pytest.mark.parametrize("kind,body,message", LOCATED_ERRORS)
def test_errors_are_located(kind, body, message):
    with pytest.raises(SpecError) as info:
        (policy if kind == "SchedulingPolicy" else task)(HEAD.format(kind=kind) + body)
    assert str(info.value) == message


def test_deadline_keeps_nanoseconds():
    t = task(
        HEAD.format(kind="Task")
        + "  deviceType: cpu\n  deadline: '2026-11-29T17:00:00.123456789+08:00'\n"
    )
    assert t.deadline.relative is False
    assert t.deadline.ns % 10**9 == 123456789
    assert format_instant(t.deadline.ns) == "2026-11-29T09:00:00.123456789Z"
    rel = task(HEAD.format(kind="Task") + "  deviceType: cpu\n  deadline: 1.000000001s\n")
    assert (
        rel.deadline == Deadline(1_000_000_001, relative=True)
        and rel.deadline.dump() == "1000000001ns"
    )
    assert parse_instant_ns("1970-01-01T00:00:01.5Z") == 1_500_000_000


# ----------------------------------------------------------------- strategies

names = st.from_regex(r"[a-z][a-z0-9-]{0,10}", fullmatch=True)
object_names = st.from_regex(r"[a-z0-9]([a-z0-9.-]{0,10}[a-z0-9])?", fullmatch=True).filter(
    lambda n: ".." not in n and ".-" not in n and "-." not in n
)
values = st.from_regex(r"[a-z0-9][a-z0-9.-]{0,6}", fullmatch=True)
label_sets = st.dictionaries(names, values, max_size=3).map(lambda d: tuple(sorted(d.items())))
expressions = st.one_of(
    st.builds(Expression, names, st.just("Exists")),
    st.builds(
        Expression,
        names,
        st.sampled_from(["In", "NotIn"]),
        st.lists(values, min_size=1, max_size=3).map(tuple),
    ),
)
selectors = st.builds(Selector, label_sets, st.lists(expressions, max_size=2).map(tuple))
optional_selectors = st.none() | selectors
sizes = st.integers(1, 2**44)


@st.composite
def constraints(draw):
    rack = draw(st.sampled_from([None, "same", "spread"]))
    return Constraints(
        gpu=GpuConstraint(
            draw(st.none() | st.builds(Version, st.integers(0, 99), st.integers(0, 99))),
            draw(st.none() | st.integers(1, 1024)),
            draw(st.none() | st.integers(1, 16)),
            draw(st.none() | names),
        ),
        cpu=CpuConstraint(
            draw(st.none() | st.integers(1, 512)),
            draw(st.booleans()),
            draw(st.sampled_from([None, "single"])),
        ),
        memory=draw(st.none() | sizes),
        io_class=draw(st.sampled_from([None, "rotational", "flash", "polled"])),
        topology=Topology(
            rack,
            draw(optional_selectors) if rack else None,
            draw(st.none() | names),
            draw(st.sampled_from([None, "none", "preferred", "required"])),
            draw(optional_selectors),
            draw(optional_selectors),
        ),
    )


@st.composite
def migrations(draw):
    idle, hot = sorted(draw(st.lists(st.floats(0, 1), min_size=2, max_size=2, unique=True)))
    return Migration(
        draw(st.integers(100_000_000, 3600 * 10**9)),
        hot,
        idle,
        draw(st.integers(0, 3600 * 10**9)),
    )


policies = st.builds(
    SchedulingPolicy,
    object_names,
    st.lists(st.builds(Rule, selectors, constraints()), min_size=1, max_size=3).map(tuple),
    st.integers(0, 100),
    st.sampled_from(["never", "lower-priority", "deadline-driven"]),
    label_sets,
    st.none() | migrations(),
    st.none() | st.builds(Queueing, st.sampled_from(["fifo", "priority", "edf", "edf-pic"])),
)


@st.composite
def tasks(draw):
    device = draw(st.sampled_from(["cpu", "gpu", "tpu"]))
    gpu = device == "gpu"
    deadline = draw(st.none() | st.builds(Deadline, st.integers(1, 2**62), st.booleans()))
    return Task(
        name=draw(object_names),
        device_type=device,
        labels=draw(label_sets),
        requests=Requests(
            draw(st.none() | st.integers(0, 512)),
            draw(st.none() | sizes),
            draw(st.none() | st.integers(0, 16)) if gpu else None,
            draw(st.none() | sizes) if gpu else None,
        ),
        deadline=deadline,
        priority=draw(st.none() | st.integers(0, 100)),
        estimated_runtime_ns=draw(st.none() | st.integers(0, 2**60)),
        migratable=draw(st.none() | st.booleans()),
        resources=tuple(
            draw(
                st.lists(
                    st.from_regex(r"[a-z0-9]([-a-z0-9]{0,8}[a-z0-9])?", fullmatch=True),
                    unique=True,
                    max_size=4,
                )
            )
        ),
        compute_graph_hash=draw(st.none() | st.from_regex(r"[0-9a-f]{64}", fullmatch=True)),
        memory_layout=draw(st.none() | st.sampled_from(["NCHW", "NHWC@64B", "row_major@4096B"])),
        num_threads=draw(st.none() | st.integers(1, 256)) if device == "cpu" else None,
        stream_id=draw(st.none() | st.integers(0, 1000)) if device != "cpu" else None,
        core_assignment=draw(
            st.none() | st.lists(st.integers(0, 64), unique=True, max_size=4).map(tuple)
        )
        if device == "tpu"
        else None,
    )


def roundtrip(data: dict, parse):
    return parse(load_text(yaml.safe_dump(data, sort_keys=False), "r.yaml")[0])


@settings(max_examples=150, deadline=None)
@given(policies)
def test_policy_parse_dump_parse_is_identity(p):
    once = roundtrip(dump_policy(p), parse_policy)
    assert once == p
    assert roundtrip(dump_policy(once), parse_policy) == once


@settings(max_examples=150, deadline=None)
@given(tasks())
def test_task_parse_dump_parse_is_identity(t):
    once = roundtrip(dump_task(t), parse_task)
    assert once == t
    assert roundtrip(dump_task(once), parse_task) == once


@settings(max_examples=200, deadline=None)
@given(st.lists(policies, max_size=6, unique_by=lambda p: p.name), label_sets)
def test_highest_priority_matching_policy_wins(ps, labels):
    m = choose(ps, dict(labels))
    matching = [p for p in ps if any(r.selector.matches(dict(labels)) for r in p.rules)]
    if not matching:
        assert m.policy is None and m.rule is None
        return
    top = max(p.priority for p in matching)
    assert m.policy.priority == top
    tied = sorted(p.name for p in matching if p.priority == top)
    assert m.policy.name == tied[0] and list(m.tied_with) == tied[1:]
    assert m.rule == next(r for r in m.policy.rules if r.selector.matches(dict(labels)))
    if len(tied) > 1:  # a real tie is always among the validation warnings
        assert any(repr(tied[0]) in w and repr(tied[1]) in w for w in tie_warnings(ps))


def test_tie_warning_only_for_overlapping_equal_priorities():
    a = SchedulingPolicy("a", (Rule(Selector((("app", "x"),))),), priority=60)
    b = SchedulingPolicy("b", (Rule(Selector((("tier", "gold"),))),), priority=60)
    c = SchedulingPolicy("c", (Rule(Selector((("app", "y"),))),), priority=60)
    d = SchedulingPolicy("d", (Rule(Selector((("app", "x"),))),), priority=70)
    assert tie_warnings([a, c, d]) == []
    assert tie_warnings([a, b]) == [
        "policies 'a' and 'b' both have priority 60 and can match the same task "
        "(app=x / tier=gold); 'a' wins by name order"
    ]


def test_the_node_order_is_the_highest_priority_policy_that_sets_one():
    rule = (Rule(Selector((("app", "x"),))),)
    plain = SchedulingPolicy("plain", rule, priority=99)
    edf = SchedulingPolicy("edf", rule, priority=60, queueing=Queueing("edf"))
    fifo = SchedulingPolicy("fifo", rule, priority=70, queueing=Queueing("fifo"))
    fifo_too = SchedulingPolicy("a-fifo", rule, priority=70, queueing=Queueing("fifo"))
    assert queueing_in_force([plain]) == ("priority", "")
    assert queueing_in_force([plain, edf]) == ("edf", "edf")
    assert queueing_in_force([edf, fifo, plain]) == ("fifo", "fifo")
    assert queueing_in_force([fifo, fifo_too]) == ("fifo", "a-fifo")  # ties by name
    # a policy whose order does not decide is named; one that agrees is not
    assert [w for w in policy_warnings([edf, fifo, fifo_too]) if "queueing" in w] == [
        "policy 'edf' sets spec.queueing.algorithm 'edf', but 'a-fifo' decides the node's "
        "order ('fifo': higher priority, then name)"
    ]


def test_validate_command(tmp_path):
    good = EXAMPLES / "video-inference-strict.yaml"
    twin = tmp_path / "twin.yaml"
    twin.write_text(good.read_text().replace("video-inference-strict", "video-twin"))
    bad = tmp_path / "bad.yaml"
    bad.write_text(HEAD.format(kind="Task") + "  deviceTyp: cpu\n")
    runner = CliRunner()
    res = runner.invoke(
        policy_cli,
        [
            "validate",
            str(good),
            str(twin),
            str(EXAMPLES / "task-infer.yaml"),
            str(EXAMPLES / "nodes.yaml"),
        ],
    )
    assert res.exit_code == 0, res.output
    assert f"{good}: ok (SchedulingPolicy video-inference-strict)" in res.output
    assert "node node-01, node node-02, node node-03, node node-04" in res.output
    assert (
        "warning: policies 'video-inference-strict' and 'video-twin' both have priority 95"
        in res.output
    )
    res = runner.invoke(policy_cli, ["validate", str(good), str(bad)])
    assert res.exit_code == 2
    assert f"{bad}:5:3: unknown field 'spec.deviceTyp' (did you mean 'deviceType'?)" in res.output
    bad_nodes = tmp_path / "nodes.yaml"
    bad_nodes.write_text("nodes:\n  - name: n1\n    gpus: 3\n")
    res = runner.invoke(policy_cli, ["validate", str(bad_nodes)])
    assert res.exit_code == 2 and f"{bad_nodes}:3:11:" in res.output


def test_unquoted_yaml_timestamp_is_refused_rather_than_truncated():
    with pytest.raises(SpecError, match=r"^t.yaml:6:13: spec.deadline: .* quote the time"):
        task(
            HEAD.format(kind="Task")
            + "  deviceType: cpu\n  deadline: 2026-11-29T17:00:00.123456789Z\n"
        )


# ------------------------------------------------------------- issue 11: bad input

FOUR_MISTAKES = """\
apiVersion: xh.scheduling/v1
kind: SchedulingPolicy
metadata: {name: four, labell: {}}
spec:
  matchRules:
    - selector: {matchLabels: {app: a}}
      constraints:
        - hardware: {gpu: {minCudaVersion: "twelve", count: 0}}
  priority: 101
"""


def test_a_policy_with_four_mistakes_reports_all_four_in_file_order():
    with pytest.raises(SpecError) as info:
        policy(FOUR_MISTAKES)
    assert str(info.value).splitlines() == [
        "p.yaml:3:24: unknown field 'metadata.labell' (did you mean 'labels'?)",
        "p.yaml:8:44: spec.matchRules.0.constraints.0.hardware.gpu.minCudaVersion: "
        "'twelve' is not a valid CUDA version: expected a version MAJOR.MINOR such as \"12.4\", "
        "got 'twelve'",
        "p.yaml:8:61: spec.matchRules.0.constraints.0.hardware.gpu.count: "
        "0 is out of range 1..1024",
        "p.yaml:9:13: spec.priority: 101 is out of range 0..100",
    ]


def test_a_task_reports_every_mistake_and_missing_parts_once():
    text = HEAD.format(kind="Task").replace("apiVersion: xh.scheduling/v1", "apiVersion: v2") + (
        "  deviceType: cpu\n  streamId: 1\n  requests: {cpus: -1, gpus: 1}\n  priority: x\n"
    )
    with pytest.raises(SpecError) as info:
        task(text)
    assert str(info.value).splitlines() == [
        "t.yaml:1:13: apiVersion: 'v2' is not one of xh.scheduling/v1",
        "t.yaml:6:3: spec.streamId is only for deviceType gpu or tpu (this task is cpu)",
        "t.yaml:7:20: spec.requests.cpus: -1 is out of range 0..65536",
        "t.yaml:7:24: spec.requests.gpus is only for deviceType gpu (this task is cpu)",
        "t.yaml:8:13: spec.priority: expected an integer, got a string",
    ]
    with pytest.raises(SpecError) as info:
        task("kind: Task\nspec: {}\n")
    assert str(info.value).splitlines() == [
        "t.yaml:1:1: missing required field 'apiVersion'",
        "t.yaml:1:1: missing required field 'metadata'",
        "t.yaml:2:7: missing required field 'spec.deviceType'",
    ]


@pytest.mark.parametrize(
    "name",
    [
        "a\x00b",
        "a\nb",
        "../etc",
        "a/b",
        "a..b",
        "Upper",
        "-x",
        "x-",
        "a b",
        "x" * 254,
        "caf\u00e9",
        "a\tb",
        "",
    ],
)
def test_names_outside_the_dns_1123_rule_are_refused(name):
    for kind, parse in (("SchedulingPolicy", policy), ("Task", task)):
        body = (
            "  matchRules: [{selector: {}}]\n"
            if kind == "SchedulingPolicy"
            else "  deviceType: cpu\n"
        )
        text = HEAD.format(kind=kind).replace("{name: x}", f"{{name: {json.dumps(name)}}}") + body
        with pytest.raises(
            SpecError, match=r"^.\.yaml:3:\d+: metadata.name: .* is not a valid name \(lowercase"
        ):
            parse(text)


def test_names_of_the_dns_1123_rule_are_kept():
    for name in ["a", "video-inference-strict", "infer-1", "0a", "a.b-c.d", "x" * 253]:
        assert (
            task(
                HEAD.format(kind="Task").replace("{name: x}", f"{{name: {name}}}")
                + "  deviceType: cpu\n"
            ).name
            == name
        )


@pytest.mark.parametrize("offset", ["+99:99", "+24:00", "-23:60"])
def test_a_deadline_offset_outside_a_day_is_refused(offset):
    with pytest.raises(
        SpecError, match=rf"^t.yaml:6:13: spec.deadline: .* offset \{offset} is not a UTC offset"
    ):
        task(
            HEAD.format(kind="Task")
            + f"  deviceType: cpu\n  deadline: '2026-11-29T17:00:00{offset}'\n"
        )
    assert (
        parse_instant_ns("2026-11-29T17:00:00-23:59") - parse_instant_ns("2026-11-29T17:00:00Z")
        == (23 * 60 + 59) * 60 * 10**9
    )


def test_versions_are_read_as_written_not_as_yaml_floats():
    rule = (
        "  matchRules:\n    - selector: {}\n      constraints:\n"
        "        - hardware: {gpu: {minCudaVersion: %s}}\n"
    )
    for text in ("12.10", "'12.10'"):
        p = policy(HEAD.format(kind="SchedulingPolicy") + rule % text)
        assert p.rules[0].constraints.gpu.min_cuda_version == Version(12, 10)
    for bad in ("12", "1.2e1", "12.1.0", "true"):
        with pytest.raises(
            SpecError, match=r"^p.yaml:8:\d+: .*minCudaVersion: .* is not a valid CUDA version"
        ):
            policy(HEAD.format(kind="SchedulingPolicy") + rule % bad)


def test_rack_peers_without_affinity_is_named_by_its_full_path():
    with pytest.raises(SpecError) as info:
        policy(
            HEAD.format(kind="SchedulingPolicy")
            + "  matchRules:\n    - selector: {}\n      constraints:\n"
            "        - topology: {rackPeers: {matchLabels: {app: a}}}\n"
        )
    assert str(info.value) == (
        "p.yaml:8:33: spec.matchRules.0.constraints.0.topology.rackPeers: "
        "needs rackAffinity (same or spread)"
    )


def test_messages_show_the_file_text_not_a_python_repr():
    with pytest.raises(SpecError) as info:
        task(HEAD.format(kind="Task") + "  deviceType: cpu\n  deadline: 2026-11-29\n")
    assert str(info.value).startswith(
        "t.yaml:6:13: spec.deadline: 2026-11-29 is not a valid deadline"
    )
    assert "datetime" not in str(info.value)


def test_sizes_are_bounded():
    for size in ["9" * 400 + "GiB", "9" * 30 + "TiB", "9" * 30]:
        with pytest.raises(
            SpecError, match=r"^t.yaml:6:\d+: .*(larger than 8 EiB|at most 64 bits)"
        ):
            task(HEAD.format(kind="Task") + f"  deviceType: cpu\n  requests: {{memory: {size}}}\n")


@pytest.fixture
def sys_root(tmp_path):
    (tmp_path / "sys" / "block" / "nvme0n1").mkdir(parents=True)
    (tmp_path / "sys" / "block" / "nvme0n1" / "dev").write_text("259:0\n")
    return tmp_path / "sys"


def test_every_example_validates_by_its_kind(sys_root):
    from xhagent.policy.documents import describe_item, load_any

    kinds = {}
    for path in sorted(EXAMPLES.glob("*.yaml")):
        kinds[path.name] = {describe_item(i).split(" ")[0] for i in load_any(path, sys_root)}
    assert kinds == {
        "cgroup-policy.yaml": {"CgroupPolicy"},
        "dwps-gpu-memory.yaml": {"Workload"},
        "dwps-gpu-nodes.yaml": {"node"},
        "migration-hot-gpu.yaml": {"Workload"},
        "migration-nodes.yaml": {"node"},
        "migration-policy.yaml": {"SchedulingPolicy"},
        "nodes.yaml": {"node"},
        "queueing-edf.yaml": {"SchedulingPolicy"},
        "queueing-dwps.yaml": {"SchedulingPolicy"},
        "queueing-fair.yaml": {"SchedulingPolicy"},
        "queueing-mlq.yaml": {"SchedulingPolicy"},
        "task-hello.yaml": {"Task"},
        "task-infer.yaml": {"Task"},
        "video-inference-strict.yaml": {"SchedulingPolicy"},
        "workload-hotcold.yaml": {"Workload"},
        "workload-inversion.yaml": {"Workload"},
        "workload-mixed.yaml": {"Workload"},
        "workload-nodes-plain.yaml": {"node"},
    }
    others = [str(p) for p in sorted(EXAMPLES.glob("*.yaml")) if p.name != "cgroup-policy.yaml"]
    res = CliRunner().invoke(policy_cli, ["validate", *others])
    assert res.exit_code == 0, res.output
    assert f"{EXAMPLES / 'workload-mixed.yaml'}: ok (Workload mixed-sla)" in res.output


def test_validate_reads_the_agent_config_and_reports_its_errors(tmp_path):
    from xhagent.policy.documents import load_any

    config = tmp_path / "agent.yaml"
    config.write_text('nodeName: gpu-07\nlabels: {rack: r12}\nreservedCpus: "0,64"\n')
    res = CliRunner().invoke(policy_cli, ["validate", str(config)])
    assert res.exit_code == 0 and f"{config}: ok (agent config for node gpu-07)" in res.output, (
        res.output
    )
    assert load_any(config)[0].reserved_cpus == (0, 64)
    config.write_text("nodeName: gpu-07\nreservedCpus: [x]\n")
    res = CliRunner().invoke(policy_cli, ["validate", str(config)])
    assert (
        res.exit_code == 2 and f"{config}:2:16: reservedCpus.0: expected an integer" in res.output
    ), res.output


def test_validate_an_empty_or_kindless_file_is_an_error(tmp_path):
    for text, message in [
        ("", "1:1: empty file: expected a SchedulingPolicy, Task, CgroupPolicy or Workload"),
        ("# only a comment\n", "1:1: empty file: expected"),
        ("---\n---\n", "1:1: empty file: expected"),
        ("foo: 1\n", "1:1: no kind: expected a SchedulingPolicy"),
        ("[1, 2]\n", "1:1: expected a mapping: a SchedulingPolicy"),
        (
            "kind: Deployment\n",
            "1:7: kind: 'Deployment' is not one of SchedulingPolicy, Task, CgroupPolicy, Workload",
        ),
        (
            HEAD.format(kind="Workload") + "  duration: 1s\n---\n" + HEAD.format(kind="Task"),
            "8:7: kind: a Workload file holds only Workload documents",
        ),
    ]:
        f = tmp_path / "f.yaml"
        f.write_text(text)
        res = CliRunner().invoke(policy_cli, ["validate", str(f)])
        assert res.exit_code == 2 and res.output.startswith(f"{f}:{message}"), (text, res.output)
        assert "Traceback" not in res.output


def test_validate_lists_the_errors_of_every_document_of_a_file_in_json(tmp_path):
    f = tmp_path / "two.yaml"
    f.write_text(FOUR_MISTAKES + "---\n" + HEAD.format(kind="Task") + "  deviceType: fpga\n")
    res = CliRunner().invoke(policy_cli, ["validate", str(f)])
    assert res.exit_code == 2
    assert [line.split(": ")[0] for line in res.output.splitlines()] == [
        f"{f}:3:24",
        f"{f}:8:44",
        f"{f}:8:61",
        f"{f}:9:13",
        f"{f}:15:15",
    ]
    res = CliRunner().invoke(policy_cli, ["validate", "--json", str(f)])
    report = json.loads(res.output)["files"][str(f)]
    assert report["ok"] is False and len(report["errors"]) == 5
    assert report["errors"][4] == {
        "file": str(f),
        "line": 15,
        "col": 15,
        "message": "spec.deviceType: 'fpga' is not one of cpu, gpu, tpu",
    }


def test_validate_notes_a_cgroup_policy_device_this_node_lacks(tmp_path):
    policy = tmp_path / "io.yaml"
    policy.write_text(
        "apiVersion: xh.scheduling/v1\nkind: CgroupPolicy\nmetadata: {name: io}\nspec:\n"
        "  groups:\n    - name: a\n      io: {weight: 100, devices: {nosuchdisk9: 200}}\n"
    )
    res = CliRunner().invoke(policy_cli, ["validate", "--json", str(policy)])
    assert res.exit_code == 0, res.output
    notes = json.loads(res.output)["files"][str(policy)]["notes"]
    assert len(notes) == 1 and notes[0].startswith(
        f"{policy}:7:35: spec.groups.0.io.devices: no block device 'nosuchdisk9' on this node"
    )
