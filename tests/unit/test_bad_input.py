"""Every class of hostile or broken input, fed to every loader of the project: each must
answer with a located message (FILE:LINE:COL, or FILE: for what is not a file at all),
never a traceback, and must not take unbounded time or memory to do so."""

import os
import resource
import time
from pathlib import Path

import pytest

from xhagent import node_model as inventory
from xhagent.cgroups.policy import load_policy
from xhagent.config import load_config
from xhagent.policy import documents
from xhagent.sched import nodes as sched_nodes
from xhagent.sched import workload
from xhagent.spec import MAX_BYTES, SpecError

HEAD = "apiVersion: xh.scheduling/v1\nkind: {kind}\nmetadata: {{name: x}}\n"
# A valid-looking start for each loader, so the bad part is reached, not a missing kind.
LOADERS = {
    "SchedulingPolicy": (
        documents.load_items,
        HEAD.format(kind="SchedulingPolicy") + "spec:\n  matchRules:\n",
    ),
    "Task": (
        documents.load_items,
        HEAD.format(kind="Task") + "spec:\n  deviceType: cpu\n  requests:\n",
    ),
    # The argv: a list whose items reach execve, so every bad item must stop here.
    "Task command": (
        documents.load_items,
        HEAD.format(kind="Task") + "spec:\n  deviceType: cpu\n  command:\n",
    ),
    "policy validate": (
        documents.load_any,
        HEAD.format(kind="Task") + "spec:\n  deviceType: cpu\n  requests:\n",
    ),
    "CgroupPolicy": (load_policy, HEAD.format(kind="CgroupPolicy") + "spec:\n  groups:\n"),
    "Workload": (workload.load_workload, HEAD.format(kind="Workload") + "spec:\n  classes:\n"),
    "node file": (sched_nodes.load_node_specs, "nodes:\n"),
    "inventory node file": (inventory.load_nodes, "name: n1\nlabels:\n"),
    "agent config": (load_config, "nodeName: n1\nlabels:\n"),
}
ERRORS = (SpecError, documents.DocumentError, inventory.ModelError)


def alias_bomb() -> str:
    lines = ["  - &a [x, x, x, x, x, x, x, x, x]"]
    lines += [
        f"  - &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]"
        for p, c in zip("abcdefgh", "bcdefghi", strict=True)
    ]
    return "\n".join(lines) + "\n"


def nested(depth: int) -> str:
    return "  " + "[" * depth + "]" * depth + "\n"


BAD = {  # name -> bytes appended to the loader's start
    "alias bomb": alias_bomb().encode(),
    "invalid UTF-8": b"  - caf\xc3\xa9 \xff\xfe\n",
    "a NUL byte": b"  - a\x00b\n",
    "nesting 5000 deep": nested(5000).encode(),
    "NaN": b"  - .nan\n",
    "infinity": b"  - -.inf\n",
    "a 400-digit number": b"  - " + b"9" * 400 + b"\n",
    "a 5000-digit number": b"  - " + b"9" * 5000 + b"\n",
    "a 400-digit size": b"  - " + b"9" * 400 + b"GiB\n",
    "an impossible date": b"  - 2026-13-45\n",
    "a python tag": b"  - !!python/object/apply:os.system [true]\n",
}

# An argument is any text without NUL: "999...9GiB" is one, not a size.
NOT_BAD = {("Task command", "a 400-digit size")}


def check(loader, path: Path | str, where: str) -> str:
    """The loader's error message for `path`, after checking it is located and bounded."""
    limit = (
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss + 512 * 1024
    )  # KiB: at most 512 MiB more
    start = time.monotonic()
    with pytest.raises(ERRORS) as info:
        loader(path)
    assert time.monotonic() - start < 5
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss < limit
    message = str(info.value)
    assert message.startswith(where), message
    for python in ("Traceback", "datetime.", "PosixPath(", "[Errno"):
        assert python not in message
    return message


@pytest.mark.parametrize("bad", BAD)
@pytest.mark.parametrize("kind", LOADERS)
def test_each_class_of_bad_content_is_a_located_error_for_each_loader(tmp_path, kind, bad):
    loader, start = LOADERS[kind]
    path = tmp_path / "bad.yaml"
    path.write_bytes(start.encode() + BAD[bad])
    if (kind, bad) in NOT_BAD:
        loader(path)
        return
    check(loader, path, f"{path}:")


@pytest.mark.parametrize("kind", LOADERS)
def test_what_is_not_a_regular_file_is_refused_by_name_without_reading_it(tmp_path, kind):
    loader, _ = LOADERS[kind]
    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * (MAX_BYTES + 1))
    assert "is a character device" in check(loader, "/dev/zero", "/dev/zero:")
    assert "is a directory" in check(loader, tmp_path, f"{tmp_path}:")
    assert "is larger than 4,194,304 bytes" in check(loader, big, f"{big}:")
    assert "No such file" in check(loader, tmp_path / "nope.yaml", f"{tmp_path / 'nope.yaml'}:")


EMPTY = {
    "CgroupPolicy": "expected exactly one CgroupPolicy document, found 0",
    "inventory node file": "empty document",
}


@pytest.mark.parametrize("kind", [k for k in LOADERS if k != "agent config"])
def test_an_empty_file_is_an_error_for_each_loader(tmp_path, kind):
    loader, _ = LOADERS[kind]
    for text in ("", "# nothing but a comment\n"):
        path = tmp_path / "empty.yaml"
        path.write_text(text)
        assert EMPTY.get(kind, ": empty file: expected") in check(loader, path, f"{path}:1:1: ")


def test_an_empty_agent_config_means_every_default(tmp_path):
    path = tmp_path / "agent.yaml"
    path.write_text("# nothing set here\n")
    config = load_config(path)
    assert config.labels.as_dict() == {} and config.reserved_cpus == ()


def test_a_fifo_is_read_once_by_policy_validate(tmp_path):
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    pid = os.fork()
    if pid == 0:
        with open(fifo, "w") as f:
            f.write(HEAD.format(kind="Task") + "spec: {deviceType: cpu}\n")
        os._exit(0)
    try:
        assert [t.name for t in documents.load_any(fifo)] == ["x"]
    finally:
        os.waitpid(pid, 0)
