"""One size rule for every file kind and option: `16G` is 16 * 10**9 bytes, `16Gi` 16 * 2**30,
in a Task, a SchedulingPolicy, a CgroupPolicy, a node file and `bench io --size` alike."""

import subprocess
import sys

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from xhagent import node_model as model
from xhagent import quantity as q
from xhagent.cgroups.policy import load_policy_text
from xhagent.policy.cli import policy as policy_cli
from xhagent.policy.policy import parse_policy
from xhagent.policy.task import dump_task, parse_task
from xhagent.spec import SpecError, load_text

G, GI = 16 * 10**9, 16 * 2**30
SIXTEEN = [("16G", G), ("16Gi", GI), ("16GB", G), ("16GiB", GI)]


@pytest.mark.parametrize(
    "text,value",
    [
        ("4096", 4096),
        ("4096B", 4096),
        ("1k", 1000),
        ("1K", 1000),
        ("1kB", 1000),
        ("1Ki", 1024),
        ("1KiB", 1024),
        ("1M", 10**6),
        ("1Mi", 2**20),
        ("1T", 10**12),
        ("1Ti", 2**40),
        ("1P", 10**15),
        ("1Pi", 2**50),
        ("1E", 10**18),
        ("7Ei", 7 * 2**60),
        ("3.84TB", 3_840_000_000_000),
        ("1.5Gi", 3 * 2**29),
        ("512 MiB", 512 << 20),
        (" 8GiB ", 8 << 30),
        ("0", 0),
        (0, 0),
        (2**63 - 1, 2**63 - 1),
        ("9223372036854775807", 2**63 - 1),
        ("0000000000000000000000016G", G),
        *SIXTEEN,
    ],
)
def test_the_rule(text, value):
    assert q.parse_size(text) == value


@pytest.mark.parametrize(
    "value,message",
    [
        (
            "16gb",
            "got '16gb' (units: k M G T P E, Ki Mi Gi Ti Pi Ei, optionally with B; case matters)",
        ),
        ("16m", "case matters"),  # milli in Kubernetes: never read as mega
        ("16gi", "case matters"),
        ("16GIB", "case matters"),
        ("16 parsecs", "case matters"),
        ("-1", "expected a size such as 4096, 512MiB or 64GiB, got '-1'"),
        (-1, "size -1 is negative"),
        ("nan", "got 'nan'"),
        ("inf", "got 'inf'"),
        ("1e9", "got '1e9'"),
        ("0x10", "got '0x10'"),
        ("", "got ''"),
        (
            "\u0661\u0666G",
            "expected a size",
        ),  # Arabic-Indic digits: int() would read them, the rule does not
        (float("nan"), "got a number"),
        (float("inf"), "got a number"),
        (1.5, "got a number"),
        (True, "got a boolean"),
        (None, "got null"),
        ([1], "got a list"),
        ("0.5", "size 0.5 is not a whole number of bytes"),
        ("0.1Ki", "not a whole number of bytes"),
        ("1." + "1" * 100 + "Ei", "not a whole number of bytes"),
        ("8Ei", "size 8Ei is larger than 8 EiB"),
        (2**63, "larger than 8 EiB"),
        ("9" * 400 + "GiB", "size 99999999999999999999... (403 characters) is larger than 8 EiB"),
        (
            "9" * 5000,
            "(5000 characters) is larger than 8 EiB",
        ),  # past int()'s digit limit: still a plain error
    ],
)
def test_what_the_rule_refuses(value, message):
    with pytest.raises(ValueError) as info:
        q.parse_size(value)
    assert message in str(info.value) and type(info.value) is ValueError


@given(st.integers(0, 2**63 - 1))
def test_format_size_reads_back(n):
    text = q.format_size(n)
    assert q.parse_size(text) == n
    if n:
        assert isinstance(text, str) or n % 1000 and n % 1024  # a unit whenever one is exact


def test_format_and_human_keep_what_was_written():
    assert (
        q.format_size(G) == "16GB" and q.format_size(GI) == "16GiB" and q.format_size(1536) == 1536
    )
    assert q.human(G) == "16 GB" and q.human(GI) == "16 GiB" and q.human(12800 << 20) == "12.5 GiB"
    assert (
        q.human(85_520_809_984, places=1) == "79.6 GiB"
        and q.human(512) == "512 B"
        and q.human(0) == "0 B"
    )


def test_kernel_text_is_binary_and_only_kernel_text():
    assert (
        q.kernel_size("48K\n") == 48 << 10
        and q.kernel_size("1M") == 1 << 20
        and q.kernel_size("") == 0
    )


def test_the_module_is_ground_floor():
    code = (
        "import sys, xhagent.quantity; "
        "print(sorted(m for m in sys.modules if m.startswith('xhagent')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "['xhagent', 'xhagent.quantity']"


# -- the same meaning in every file kind ----------------------------------------------------
HEAD = "apiVersion: xh.scheduling/v1\nkind: {kind}\nmetadata: {{name: x}}\nspec:\n"


@pytest.mark.parametrize("text,value", SIXTEEN)
def test_task(text, value):
    t = parse_task(
        load_text(
            HEAD.format(kind="Task") + f"  deviceType: gpu\n  requests: {{memory: {text}, "
            f"gpus: 1, gpuMemory: {text}}}\n",
            "t.yaml",
        )[0]
    )
    assert t.requests.memory == value and t.requests.gpu_memory == value
    assert dump_task(t)["spec"]["requests"]["memory"] == ("16GiB" if value == GI else "16GB")


@pytest.mark.parametrize("text,value", SIXTEEN)
def test_scheduling_policy(text, value):
    p = parse_policy(
        load_text(
            HEAD.format(kind="SchedulingPolicy") + "  matchRules:\n    - selector: {}\n"
            f"      constraints:\n        - memory: {text}\n",
            "p.yaml",
        )[0]
    )
    assert p.rules[0].constraints.memory == value


@pytest.mark.parametrize("text,value", SIXTEEN)
def test_cgroup_policy(text, value, tmp_path):
    groups = f"  groups:\n    - name: a\n      memory: {{max: {text}}}\n"
    p = load_policy_text(HEAD.format(kind="CgroupPolicy") + groups, "c.yaml", tmp_path)
    assert (
        p.groups[0].settings["memory.max"] == value - value % 4096
    )  # the kernel keeps whole pages


@pytest.mark.parametrize("text,value", SIXTEEN)
def test_node_file(text, value):
    (node,) = model.load_nodes_text(
        f"name: n\nmemory: {{total: {text}, available: {text}}}\n"
        f"io: [{{name: sda, dev: '8:0', sizeBytes: {text}}}]\n",
        "n.yaml",
    )
    assert node.memory.total == node.memory.available == node.io[0].size_bytes == value


@pytest.mark.parametrize("text,value", SIXTEEN)
def test_bench_io_size(text, value, monkeypatch):
    from xhagent.bench import io as bench

    seen = []
    monkeypatch.setattr(bench, "_check_room", lambda nbytes: None)
    monkeypatch.setattr(
        bench, "run", lambda file, nbytes, seconds, progress: seen.append(nbytes) or {}
    )
    monkeypatch.setattr(bench, "_table", lambda report: "")
    res = CliRunner().invoke(bench.bench_io, ["--size", text])
    assert res.exit_code == 0, res.output
    assert seen == [value]


def test_the_bound_is_located_in_every_file_kind(tmp_path):
    big = "9" * 400 + "Gi"
    with pytest.raises(SpecError, match=r"^t\.yaml:6:\d+: .*larger than 8 EiB"):
        parse_task(
            load_text(
                HEAD.format(kind="Task") + f"  deviceType: cpu\n  requests: {{memory: {big}}}\n",
                "t.yaml",
            )[0]
        )
    with pytest.raises(SpecError, match=r"^c\.yaml:7:21: .*larger than 8 EiB"):
        load_policy_text(
            HEAD.format(kind="CgroupPolicy")
            + f"  groups:\n    - name: a\n      memory: {{max: {big}}}\n",
            "c.yaml",
            tmp_path,
        )
    with pytest.raises(
        model.ModelError, match=r"^n\.yaml:2:17: memory\.total: .*larger than 8 EiB"
    ):
        model.load_nodes_text(f"name: n\nmemory: {{total: {big}}}\n", "n.yaml")


def test_explain_shows_what_the_task_file_said(tmp_path):
    # 15 GiB free (16.1 * 10**9 bytes): a 16G task fits, a 16Gi task does not, and each is told
    # in its unit.
    (tmp_path / "n.yaml").write_text(
        "name: n\nmemory: {total: 15Gi, available: 15Gi}\n"
        "numa: [{id: 0, l3: [{id: 0, cores: [{id: 0, package: 0, cpus: [0]}]}]}]\n"
    )
    short = "n: InsufficientMemory: n has 15 GiB free, task needs 16 GiB"
    for text, verdict in (("16G", "n: feasible"), ("16Gi", short)):
        body = f"  deviceType: cpu\n  requests: {{cpus: 1, memory: {text}}}\n"
        (tmp_path / "t.yaml").write_text(HEAD.format(kind="Task") + body)
        args = ["explain", "--task", str(tmp_path / "t.yaml"), "--nodes", str(tmp_path / "n.yaml")]
        res = CliRunner().invoke(policy_cli, args)
        assert verdict in res.output, res.output
        assert f"needs: 1 CPU, 16 {'GiB' if text.endswith('i') else 'GB'} memory" in res.output, (
            res.output
        )
