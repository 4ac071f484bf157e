"""Every command that reads a file, fed every class of bad file: a message naming the file,
exit 2, no traceback, in bounded time (10 s) and memory (1 GiB more address space)."""

import resource
import signal
from contextlib import contextmanager
from pathlib import Path

import pytest
from click.testing import CliRunner

from xhagent.cli import main

EXAMPLES = Path(__file__).resolve().parents[2] / "configs" / "examples"
BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True)
)

BAD_FILES = {
    "missing": None,
    "directory": None,
    "dev_zero": "/dev/zero",
    "empty": b"",
    "binary": bytes(range(256)) * 16,
    "bad_utf8": b"kind: Task\nmetadata: {name: caf\xe9}\n",
    "alias_bomb": BOMB.encode(),
    "deep_nesting": b"[" * 5000 + b"]" * 5000,
    "only_comments": b"# nothing here\n",
}

# Each command, with {} where the bad file goes.
COMMANDS = {
    "policy validate": ["policy", "validate", "{}"],
    "policy explain --task": [
        "policy",
        "explain",
        "--task",
        "{}",
        "--nodes",
        str(EXAMPLES / "nodes.yaml"),
    ],
    "policy explain --policies": [
        "policy",
        "explain",
        "--task",
        str(EXAMPLES / "task-infer.yaml"),
        "--policies",
        "{}",
        "--nodes",
        str(EXAMPLES / "nodes.yaml"),
    ],
    "policy explain --nodes": [
        "policy",
        "explain",
        "--task",
        str(EXAMPLES / "task-infer.yaml"),
        "--nodes",
        "{}",
    ],
    "simulate --workload": [
        "simulate",
        "--workload",
        "{}",
        "--nodes",
        str(EXAMPLES / "workload-nodes-plain.yaml"),
        "--algorithm",
        "edf",
    ],
    "simulate --nodes": [
        "simulate",
        "--workload",
        str(EXAMPLES / "workload-mixed.yaml"),
        "--nodes",
        "{}",
        "--algorithm",
        "edf",
    ],
    "cgroup plan": ["cgroup", "plan", "-f", "{}"],
    "inventory --config": ["inventory", "--config", "{}"],
    "trace stats": ["trace", "stats", "{}"],
    "trace export": ["trace", "export", "{}", "--format", "perf", "-o", "-"],
    "trace heatmap": ["trace", "heatmap", "{}", "-o", "{out}"],
}


# Not bad input there: --policies takes a directory of policy files, and an empty agent
# config means every default.
VALID = {
    ("policy explain --policies", "directory"),
    ("inventory --config", "empty"),
    ("inventory --config", "only_comments"),
}


@contextmanager
def bounded(seconds=10, extra_bytes=1 << 30):
    """A soft address-space limit above what this process maps now, and an alarm: an input
    that makes a loader allocate or loop without end fails the test instead of the machine."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as f:
        mapped = int(f.read().split()[0]) * resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_AS, (mapped + extra_bytes, hard))

    def timeout(*_):
        raise TimeoutError(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, timeout)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@pytest.fixture
def bad_file(request, tmp_path):
    kind = request.param
    if kind == "missing":
        return kind, str(tmp_path / "no-such-file.yaml")
    if kind == "directory":
        return kind, str(tmp_path)
    content = BAD_FILES[kind]
    if isinstance(content, str):
        return kind, content
    path = tmp_path / f"{kind}.yaml"
    path.write_bytes(content)
    return kind, str(path)


@pytest.mark.parametrize(
    "command,bad_file",
    [(c, k) for c in COMMANDS for k in BAD_FILES if (c, k) not in VALID],
    indirect=["bad_file"],
)
def test_bad_file_is_a_located_error(command, bad_file, tmp_path):
    kind, path = bad_file
    out = tmp_path / "out.svg"
    args = [a.replace("{}", path).replace("{out}", str(out)) for a in COMMANDS[command]]
    with bounded():
        res = CliRunner().invoke(main, args, input="")
    said = res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert res.exit_code == 2, f"exit {res.exit_code}: {said[-2000:]}"
    assert path in said, said[-2000:]
    assert len(said) < 20_000  # capped messages, not a dump of the input
    assert not out.exists()
