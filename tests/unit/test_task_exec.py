"""A Task's execution fields (issue 13): command, env, workingDir, user, class, restartPolicy,
preemption, enforce. Parse -> dump -> parse, defaults, and every mistake as FILE:LINE:COL."""

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from xhagent.policy import documents
from xhagent.policy.cli import policy as policy_cli
from xhagent.policy.task import Requests, Task, dump_task, parse_task
from xhagent.policy.task_exec import (
    BACKOFF_CAP_NS,
    ENFORCEABLE,
    MAX_ARG_BYTES,
    MAX_ARGV_BYTES,
    MAX_ENV,
    PREEMPTION_MODES,
    RestartPolicy,
    RunAs,
)
from xhagent.spec import SpecError, SpecErrors, load_text

EXAMPLES = Path(__file__).resolve().parents[2] / "configs" / "examples"
HEAD = "apiVersion: xh.scheduling/v1\nkind: Task\nmetadata: {name: x}\nspec:\n  deviceType: cpu\n"
S = 10**9

FULL = HEAD + (
    "  command: [python3, serve.py, --port, '8080']\n"
    "  env: {MODEL: resnet50, EMPTY: '', _X1: 'a b'}\n"
    "  workingDir: /srv/infer\n"
    "  user: infer:video\n"
    "  class: latency\n"
    "  restartPolicy: {policy: OnFailure, maxRestarts: 5, backoff: 500ms}\n"
    "  preemption: kill\n"
    "  enforce: [cpuset, memory]\n"
)


def task(body: str, **kw) -> Task:
    return parse_task(load_text(HEAD + body, "t.yaml")[0], **kw)


def errors(body: str, **kw) -> list[str]:
    with pytest.raises(SpecError) as info:
        task(body, **kw)
    return str(info.value).splitlines()


def roundtrip(t: Task) -> Task:
    return parse_task(load_text(yaml.safe_dump(dump_task(t), sort_keys=False), "r.yaml")[0])


def test_a_task_with_every_execution_field_parses_and_round_trips():
    t = parse_task(load_text(FULL, "t.yaml")[0], require_command=True)
    assert t == Task(
        "x",
        "cpu",
        command=("python3", "serve.py", "--port", "8080"),
        env=(("MODEL", "resnet50"), ("EMPTY", ""), ("_X1", "a b")),
        working_dir="/srv/infer",
        user=RunAs("infer", "video"),
        task_class="latency",
        restart_policy=RestartPolicy("OnFailure", 5, S // 2),
        preemption="kill",
        enforce=("cpuset", "memory"),
    )
    spec = dump_task(t)["spec"]
    assert spec["restartPolicy"] == {"policy": "OnFailure", "maxRestarts": 5, "backoff": "500ms"}
    assert spec["user"] == "infer:video" and spec["class"] == "latency"
    assert roundtrip(t) == t


def test_absent_fields_take_their_defaults_and_are_not_dumped():
    t = task("")
    assert (t.command, t.env, t.working_dir, t.user) == (None, (), None, None)
    assert t.task_class == "batch" and t.preemption == "freeze" and t.enforce == ()
    assert t.restart_policy == RestartPolicy("Never", 3, S)
    assert dump_task(t)["spec"] == {"deviceType": "cpu"}
    # Written out at their defaults, they mean the same task.
    assert task("  class: batch\n  preemption: freeze\n  restartPolicy: Never\n  env: {}\n") == t


def test_existing_task_files_parse_as_before():
    # the example as it was before tasks ran commands: none of the fields that run one
    text = (EXAMPLES / "task-infer.yaml").read_text()
    text = "".join(line for line in text.splitlines(True) if "command:" not in line)
    t = parse_task(load_text(text, "t.yaml")[0])
    assert t.command is None and t.task_class == "batch" and t.restart_policy == RestartPolicy()
    assert not {"command", "env", "class", "restartPolicy", "preemption"} & set(
        dump_task(t)["spec"]
    )
    assert Task("a", "gpu", requests=Requests(gpus=1)).preemption == "freeze"


def test_the_example_runs_a_real_command():
    path = EXAMPLES / "task-hello.yaml"
    (t,) = documents.load_items(path)
    assert t.command[:2] == ("sh", "-c") and "sleep 2" in t.command[2]
    assert t.working_dir == "/tmp" and t.task_class == "batch" and dict(t.env)["REPEAT"] == "1"
    assert t.restart_policy == RestartPolicy("OnFailure", 2, 2 * S)
    assert parse_task(load_text(path.read_text(), str(path))[0], require_command=True) == t


def test_restart_policy_scalar_and_mapping_forms():
    assert task("  restartPolicy: OnFailure\n").restart_policy == RestartPolicy("OnFailure")
    assert task("  restartPolicy: {policy: OnFailure}\n").restart_policy == RestartPolicy(
        "OnFailure", 3, S
    )
    assert task("  restartPolicy: {policy: Never}\n").restart_policy == RestartPolicy()
    t = task("  restartPolicy: {policy: OnFailure, maxRestarts: 0, backoff: 5m}\n")
    assert t.restart_policy == RestartPolicy("OnFailure", 0, BACKOFF_CAP_NS)
    assert dump_task(t)["spec"]["restartPolicy"]["backoff"] == "5m"
    assert dump_task(task("  restartPolicy: OnFailure\n"))["spec"]["restartPolicy"] == "OnFailure"


def test_backoff_doubles_after_each_restart_up_to_five_minutes():
    r = RestartPolicy("OnFailure", 1000, 2 * S)
    assert [r.delay_ns(n) // S for n in range(10)] == [2, 4, 8, 16, 32, 64, 128, 256, 300, 300]
    assert r.delay_ns(999) == BACKOFF_CAP_NS == 300 * S
    assert RestartPolicy("OnFailure", 3, 1).delay_ns(10**6) == BACKOFF_CAP_NS


@pytest.mark.parametrize(
    "written,user",
    [
        ("nobody", RunAs("nobody")),
        ("0", RunAs(0)),
        ("'1000'", RunAs(1000)),
        # Unquoted, YAML 1.1 reads 1000:1000 as a base-60 number (61000): read as written.
        ("1000:1000", RunAs(1000, 1000)),
        ("www-data:33", RunAs("www-data", 33)),
        ("_svc.ci:wheel", RunAs("_svc.ci", "wheel")),
        ("4294967294", RunAs(2**32 - 2)),
    ],
)
def test_user_is_a_name_or_an_id_with_an_optional_group(written, user):
    t = task(f"  user: {written}\n")
    assert t.user == user
    assert roundtrip(t) == t


def test_command_and_env_bounds_are_inclusive():
    arg = "a" * MAX_ARG_BYTES
    assert task(f"  command: [{arg}]\n").command == (arg,)
    # Each argument counts with its NUL: 31 of 4096 bytes, plus 31 NULs, fit in 128 KiB...
    n = MAX_ARGV_BYTES // (MAX_ARG_BYTES + 1)
    assert len(task(f"  command: [{', '.join([arg] * n)}]\n").command) == n
    # ...and one argument more does not.
    (line,) = errors(f"  command: [{', '.join([arg] * (n + 1))}]\n")
    assert line == (
        f"t.yaml:6:12: spec.command: the arguments take {(n + 1) * (MAX_ARG_BYTES + 1):,} bytes, "
        "more than 131,072 (128 KiB, each counted with a terminating NUL)"
    )
    env = ", ".join(f"V{i}: x" for i in range(MAX_ENV))
    assert len(task(f"  env: {{{env}}}\n").env) == MAX_ENV
    assert errors(f"  env: {{{env}, LAST: x}}\n") == [
        "t.yaml:6:8: spec.env: 1,025 variables, more than 1,024"
    ]
    # Multi-byte characters count in bytes, as the kernel counts them.
    assert errors(f"  command: [{'é' * 2049}]\n") == [
        "t.yaml:6:13: spec.command.0: an argument of 4,098 bytes, more than 4,096"
    ]


@pytest.mark.parametrize(
    "body,message",
    [
        (
            "  command: echo hi\n",
            "6:12: spec.command: expected a list of arguments such as [sh, -c, 'echo hi'], "
            "got a string",
        ),
        ("  command: {a: b}\n", "6:12: spec.command: expected a list, got a mapping"),
        (
            "  command: []\n",
            "6:12: spec.command: an empty list: the first argument names the program",
        ),
        (
            "  command: [sleep, 2]\n",
            '6:20: spec.command.1: expected a string, got an integer (quote it: "2")',
        ),
        ("  command: [echo, '']\n", "6:19: spec.command.1: an argument cannot be empty"),
        (
            '  command: [echo, "a\\0b"]\n',
            "6:19: spec.command.1: an argument cannot contain a NUL character",
        ),
        ("  command: [echo, [a]]\n", "6:19: spec.command.1: expected a string, got a list"),
        ("  command: [echo, ~]\n", "6:19: spec.command.1: expected a string, got null"),
        (
            f"  command: [{'x' * (MAX_ARG_BYTES + 1)}]\n",
            "6:13: spec.command.0: an argument of 4,097 bytes, more than 4,096",
        ),
        ("  env: [A=b]\n", "6:8: spec.env: expected a mapping, got a list"),
        (
            "  env: {A: x, 9LIVES: y}\n",
            "6:15: spec.env: '9LIVES' is not a variable name (letters, digits and '_', "
            "not starting with a digit)",
        ),
        (
            "  env: {A-B: y}\n",
            "6:9: spec.env: 'A-B' is not a variable name (letters, digits and '_', "
            "not starting with a digit)",
        ),
        (
            "  env: {DEBUG: true}\n",
            '6:16: spec.env.DEBUG: expected a string, got a boolean (quote it: "true")',
        ),
        (
            "  env: {N: 010}\n",
            '6:12: spec.env.N: expected a string, got an integer (quote it: "010")',
        ),
        (
            "  env: {N: 1.50}\n",
            '6:12: spec.env.N: expected a string, got a number (quote it: "1.50")',
        ),
        (
            "  env: {N: }\n",
            '6:11: spec.env.N: expected a string, got null (write "" for an empty one)',
        ),
        ('  env: {N: "a\\0"}\n', "6:12: spec.env.N: a value cannot contain a NUL character"),
        (
            "  workingDir: tmp/work\n",
            "6:15: spec.workingDir: 'tmp/work' is not an absolute path (start it with /)",
        ),
        (
            "  workingDir: ''\n",
            "6:15: spec.workingDir: '' is not an absolute path (start it with /)",
        ),
        (
            "  workingDir: 42\n",
            '6:15: spec.workingDir: expected a string, got an integer (quote it: "42")',
        ),
        (
            f"  workingDir: /{'d' * 4096}\n",
            "6:15: spec.workingDir: a path of 4,097 bytes, more than 4,096",
        ),
        (
            "  user: 'bad user'\n",
            "6:9: spec.user: 'bad user' is not a valid user: user 'bad user' is not a name "
            "(letters, "
            "digits, '.', '_' and '-', starting with a letter or '_', at most 32) or a numeric id",
        ),
        (
            "  user: 'root:'\n",
            "6:9: spec.user: 'root:' is not a valid user: nothing after ':' (write name:group, "
            "or leave out the ':')",
        ),
        (
            "  user: 'a:b:c'\n",
            "6:9: spec.user: 'a:b:c' is not a valid user: group 'b:c' is not a name (letters, "
            "digits, '.', '_' and '-', starting with a letter or '_', at most 32) or a numeric id",
        ),
        (
            "  user: 4294967295\n",
            "6:9: spec.user: 4294967295 is not a valid user: user id 4294967295 is out of range "
            "0..4294967294",
        ),
        (
            "  user: [root]\n",
            "6:9: spec.user: a list is not a valid user: expected a user name or uid, "
            "optionally with :group or :gid",
        ),
        (
            "  class: Latency\n",
            "6:10: spec.class: 'Latency' is not a class name (a DNS-1123 label: lowercase letters, "
            "digits and '-', starting and ending with a letter or digit, at most 63)",
        ),
        (
            "  class: gold.tier\n",
            "6:10: spec.class: 'gold.tier' is not a class name (a DNS-1123 label: lowercase "
            "letters, "
            "digits and '-', starting and ending with a letter or digit, at most 63)",
        ),
        ("  class: 3\n", "6:10: spec.class: expected a string, got an integer"),
        (
            "  restartPolicy: Always\n",
            "6:18: spec.restartPolicy: 'Always' is not one of Never, OnFailure",
        ),
        (
            "  restartPolicy: OnFalure\n",
            "6:18: spec.restartPolicy: 'OnFalure' is not one of Never, OnFailure "
            "(did you mean 'OnFailure'?)",
        ),
        (
            "  restartPolicy: {policy: onfailure}\n",
            "6:27: spec.restartPolicy.policy: 'onfailure' is not one of Never, OnFailure "
            "(did you mean 'OnFailure'?)",
        ),
        (
            "  restartPolicy: [OnFailure]\n",
            "6:18: spec.restartPolicy: expected Never, OnFailure or a mapping such as "
            "{policy: OnFailure, maxRestarts: 3, backoff: 1s}",
        ),
        (
            "  restartPolicy: {maxRestarts: 3}\n",
            "6:18: missing required field 'spec.restartPolicy.policy'",
        ),
        (
            "  restartPolicy: {policy: OnFailure, retries: 3}\n",
            "6:38: unknown field 'spec.restartPolicy.retries'",
        ),
        (
            "  restartPolicy: {policy: OnFailure, maxRestart: 3}\n",
            "6:38: unknown field 'spec.restartPolicy.maxRestart' (did you mean 'maxRestarts'?)",
        ),
        (
            "  restartPolicy: {policy: OnFailure, maxRestarts: 1001}\n",
            "6:51: spec.restartPolicy.maxRestarts: 1001 is out of range 0..1000",
        ),
        (
            "  restartPolicy: {policy: OnFailure, maxRestarts: -1}\n",
            "6:51: spec.restartPolicy.maxRestarts: -1 is out of range 0..1000",
        ),
        (
            "  restartPolicy: {policy: Never, maxRestarts: 3}\n",
            "6:34: spec.restartPolicy.maxRestarts: only with policy OnFailure",
        ),
        (
            "  restartPolicy: {policy: OnFailure, backoff: 2 seconds}\n",
            "6:47: spec.restartPolicy.backoff: '2 seconds' is not a valid duration: "
            "expected a duration such as 250ms, 1.5s or 1h30m",
        ),
        (
            "  restartPolicy: {policy: OnFailure, backoff: 0s}\n",
            "6:47: spec.restartPolicy.backoff: 0s is out of range 1ns..5m "
            "(it doubles after each restart, up to 5m)",
        ),
        (
            "  restartPolicy: {policy: OnFailure, backoff: 5m1s}\n",
            "6:47: spec.restartPolicy.backoff: 5m1s is out of range 1ns..5m "
            "(it doubles after each restart, up to 5m)",
        ),
        (
            "  preemption: freez\n",
            "6:15: spec.preemption: 'freez' is not one of freeze, kill, never "
            "(did you mean 'freeze'?)",
        ),
        (
            "  preemption: lower-priority\n",
            "6:15: spec.preemption: 'lower-priority' is not one of freeze, kill, never",
        ),
        (
            "  enforce: [cpu, memroy]\n",
            "6:18: spec.enforce.1: 'memroy' is not one of cpu, cpuset, memory, io, pids "
            "(did you mean 'memory'?)",
        ),
        ("  enforce: [io, io]\n", "6:17: spec.enforce.1: 'io' is listed twice"),
        ("  enforce: memory\n", "6:12: spec.enforce: expected a list, got a string"),
        (
            "  comand: [true]\n",
            "6:3: unknown field 'spec.comand' (did you mean 'command'?)",
        ),
        (
            "  workdir: /tmp\n",
            "6:3: unknown field 'spec.workdir' (did you mean 'workingDir'?)",
        ),
    ],
)
def test_each_mistake_is_one_located_error(body, message):
    assert errors(body) == [f"t.yaml:{message}"]


def test_every_error_of_the_file_is_reported_in_file_order():
    lines = errors(
        "  command: [sh, 2, '']\n"
        "  env: {DEBUG: yes, 1X: a}\n"
        "  workingDir: relative\n"
        "  user: 'a b'\n"
        "  class: Batch\n"
        "  restartPolicy: {policy: OnFalure, maxRestart: 3}\n"
        "  preemption: freez\n"
        "  enforce: [cpu, memroy, cpu]\n"
    )
    assert [line.split(": ")[0:2] for line in lines] == [
        ["t.yaml:6:17", "spec.command.1"],
        ["t.yaml:6:20", "spec.command.2"],
        ["t.yaml:7:16", "spec.env.DEBUG"],
        ["t.yaml:7:21", "spec.env"],
        ["t.yaml:8:15", "spec.workingDir"],
        ["t.yaml:9:9", "spec.user"],
        ["t.yaml:10:10", "spec.class"],
        ["t.yaml:11:27", "spec.restartPolicy.policy"],
        [
            "t.yaml:11:37",
            "unknown field 'spec.restartPolicy.maxRestart' (did you mean 'maxRestarts'?)",
        ],
        ["t.yaml:12:15", "spec.preemption"],
        ["t.yaml:13:18", "spec.enforce.1"],
        ["t.yaml:13:26", "spec.enforce.2"],
    ]
    assert lines[2].endswith('(quote it: "yes")')  # YAML 1.1 reads yes as true


def test_command_is_required_only_where_the_task_is_to_run(tmp_path):
    assert task("").command is None  # placement (policy explain) needs no command
    assert errors("  requests: {cpus: 1}\n", require_command=True) == [
        "t.yaml:5:3: missing required field 'spec.command' (the argv to run, "
        "such as [sh, -c, 'echo hi'])"
    ]
    assert task("  command: ['true']\n", require_command=True).command == ("true",)
    # With other mistakes, the missing command is one error among them.
    lines = errors("  priority: 101\n", require_command=True)
    assert lines == [
        "t.yaml:5:3: missing required field 'spec.command' (the argv to run, "
        "such as [sh, -c, 'echo hi'])",
        "t.yaml:6:13: spec.priority: 101 is out of range 0..100",
    ]
    # A document without spec says so once, not twice.
    with pytest.raises(SpecErrors) as info:
        parse_task(
            load_text("apiVersion: xh.scheduling/v1\nkind: Task\nmetadata: {name: x}\n", "t.yaml")[
                0
            ],
            require_command=True,
        )
    assert str(info.value) == "t.yaml:1:1: missing required field 'spec'"
    # validate reads placement-only Task files as before.
    path = tmp_path / "t.yaml"
    path.write_text(HEAD)
    res = CliRunner().invoke(policy_cli, ["validate", str(path)])
    assert res.exit_code == 0 and f"{path}: ok (Task x)" in res.output, res.output


def test_validate_reports_execution_errors_and_exits_2(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text(HEAD + "  command: []\n  enforce: [gpu]\n")
    res = CliRunner().invoke(policy_cli, ["validate", str(path)])
    assert res.exit_code == 2
    assert f"{path}:6:12: spec.command: an empty list" in res.output
    assert (
        f"{path}:7:13: spec.enforce.0: 'gpu' is not one of cpu, cpuset, memory, io, pids"
        in res.output
    )
    assert "Traceback" not in res.output


# ------------------------------------------------------------------------- round trip

_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=12)
_user_part = st.integers(0, 2**32 - 2) | st.from_regex(
    r"[A-Za-z_][A-Za-z0-9._-]{0,8}", fullmatch=True
)
_class = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,10}[a-z0-9])?", fullmatch=True)


@st.composite
def exec_tasks(draw):
    names = draw(
        st.lists(
            st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True), max_size=5, unique=True
        )
    )
    policy = draw(st.sampled_from(["Never", "OnFailure"]))
    restart = (
        RestartPolicy("OnFailure", draw(st.integers(0, 1000)), draw(st.integers(1, BACKOFF_CAP_NS)))
        if policy == "OnFailure"
        else RestartPolicy()
    )
    return Task(
        "t",
        draw(st.sampled_from(["cpu", "gpu", "tpu"])),
        command=draw(st.none() | st.lists(_text.filter(bool), min_size=1, max_size=4).map(tuple)),
        env=tuple((n, draw(_text)) for n in names),
        working_dir=draw(st.none() | _text.map(lambda s: "/" + s)),
        user=draw(st.none() | st.builds(RunAs, _user_part, st.none() | _user_part)),
        task_class=draw(_class),
        restart_policy=restart,
        preemption=draw(st.sampled_from(PREEMPTION_MODES)),
        enforce=tuple(draw(st.lists(st.sampled_from(ENFORCEABLE), unique=True))),
    )


@settings(max_examples=150, deadline=None)
@given(exec_tasks())
def test_execution_fields_parse_dump_parse_is_identity(t):
    once = roundtrip(t)
    assert once == t
    assert roundtrip(once) == once


def test_a_checkpoint_hook_parses_round_trips_and_belongs_to_migratable_tasks():
    from xhagent.policy.task_exec import Checkpoint

    t = task("  migratable: true\n  checkpoint: {command: [ckpt, --save, /x], timeout: 2s}\n")
    assert t.checkpoint == Checkpoint(("ckpt", "--save", "/x"), 2 * S)
    assert roundtrip(t) == t
    plain = task("  migratable: true\n  checkpoint: {command: [ckpt]}\n")
    assert plain.checkpoint == Checkpoint(("ckpt",), 30 * S)
    assert dump_task(plain)["spec"]["checkpoint"] == {"command": ["ckpt"]}
    assert task("  migratable: true\n").checkpoint is None


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            "  checkpoint: {command: [ckpt]}\n",
            "6:3: spec.checkpoint: only for a task with migratable: true (it runs when the "
            "agent moves the task to another device)",
        ),
        (
            "  migratable: false\n  checkpoint: {command: [ckpt]}\n",
            "7:3: spec.checkpoint: only for a task with migratable: true (it runs when the "
            "agent moves the task to another device)",
        ),
        (
            "  migratable: true\n  checkpoint: {command: 'ckpt --save'}\n",
            "7:25: spec.checkpoint.command: expected a list of arguments such as "
            "[sh, -c, 'echo hi'], got a string",
        ),
        (
            "  migratable: true\n  checkpoint: {command: [ckpt], timeout: 6m}\n",
            "7:42: spec.checkpoint.timeout: 6m is out of range 1ms..5m",
        ),
        (
            "  migratable: true\n  checkpoint: {command: [ckpt], timeout: 0s}\n",
            "7:42: spec.checkpoint.timeout: 0s is out of range 1ms..5m",
        ),
        (
            "  migratable: true\n  checkpoint: {command: [ckpt], timout: 1s}\n",
            "7:33: unknown field 'spec.checkpoint.timout' (did you mean 'timeout'?)",
        ),
        (
            "  migratable: true\n  checkpoint: {timeout: 1s}\n",
            "7:15: missing required field 'spec.checkpoint.command'",
        ),
        (
            "  migratable: true\n  checkpoint: [ckpt]\n",
            "7:15: spec.checkpoint: expected a mapping such as "
            "{command: [ckpt, --save], timeout: 30s}",
        ),
    ],
)
def test_each_checkpoint_mistake_is_one_located_error(body, message):
    assert errors(body) == [f"t.yaml:{message}"]


GPU_HEAD = HEAD.replace("deviceType: cpu", "deviceType: gpu")


def gpu_errors(body: str) -> list[str]:
    with pytest.raises(SpecError) as info:
        parse_task(load_text(GPU_HEAD + body, "t.yaml")[0])
    return str(info.value).splitlines()


def test_runs_on_lists_the_device_types_a_move_may_take_a_migratable_task_to():
    t = parse_task(load_text(GPU_HEAD + "  migratable: true\n  runsOn: [gpu, tpu]\n", "t")[0])
    assert t.runs_on == ("gpu", "tpu") and roundtrip(t) == t
    assert dump_task(t)["spec"]["runsOn"] == ["gpu", "tpu"]
    assert parse_task(load_text(GPU_HEAD + "  migratable: true\n", "t")[0]).runs_on == ()


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            "  runsOn: [gpu, tpu]\n",
            "6:3: spec.runsOn: only for a task with migratable: true (the device types the "
            "agent may move the task to)",
        ),
        (
            "  migratable: true\n  runsOn: [tpu]\n",
            "7:11: spec.runsOn: lists tpu, not the deviceType gpu",
        ),
        (
            "  migratable: true\n  runsOn: [gpu, gpu]\n",
            "7:17: spec.runsOn.1: 'gpu' is listed twice",
        ),
        ("  migratable: true\n  runsOn: gpu\n", "7:11: spec.runsOn: expected a list, got a string"),
    ],
)
def test_each_runs_on_mistake_is_one_located_error(body, message):
    assert gpu_errors(body) == [f"t.yaml:{message}"]


def test_runs_on_is_not_for_cpu_tasks():
    assert errors("  migratable: true\n  runsOn: [gpu]\n") == [
        "t.yaml:7:11: spec.runsOn: only for deviceType gpu or tpu (this task is cpu)"
    ]
