"""`xhagent run` with every Python object from malloc: the real agent executes itself once
with PYTHONMALLOC=malloc (the same pid), says so, and hands none of it to its workloads."""

import json
import os
from pathlib import Path

import pytest
from test_daemon_host import Agent, task_file

pytestmark = pytest.mark.host

MINE = ("PYTHONMALLOC", "XHAGENT_ALLOCATOR")


def started(tmp_path, *extra: str) -> Agent:
    a = Agent(tmp_path, f"xhagent-alloc-test-{os.getpid()}-{tmp_path.name[-12:]}.slice",
              extra=extra)  # fmt: skip
    a.start()
    return a


def exec_env(pid: int) -> dict[str, str]:
    """The environment the process's image was executed with."""
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(e.decode().split("=", 1) for e in raw if b"=" in e)


def allocator_event(agent: Agent) -> str:
    lines = agent.cli("events", "--json", check=True).stdout.splitlines()
    (said,) = [e["message"] for e in map(json.loads, lines) if e["kind"] == "Allocator"]
    return said


def test_the_agent_runs_on_malloc_and_no_workload_inherits_it(tmp_path):
    agent = started(tmp_path)
    try:
        env = exec_env(agent.proc.pid)  # the child the test started, after its own exec
        assert env.get("PYTHONMALLOC") == "malloc" and env.get("XHAGENT_ALLOCATOR") == "malloc"
        assert allocator_event(agent).startswith("malloc (every object from malloc")
        tid = agent.submit(task_file(tmp_path, "env", ["env"], "  env: {GIVEN: here}\n"))
        assert agent.wait(tid)["state"] == "Succeeded"
        out = agent.cli("logs", tid, "--stream", "stdout", check=True).stdout
        assert "GIVEN=here" in out and not [n for n in MINE if f"{n}=" in out], out
    finally:
        agent.stop()
        agent.remove_subtree()


def test_pymalloc_asked_for_is_no_exec(tmp_path):
    agent = started(tmp_path, "--allocator", "pymalloc")
    try:
        assert not set(MINE) & set(exec_env(agent.proc.pid))
        said = allocator_event(agent)
        assert said == "pymalloc (--allocator pymalloc: freed memory can stay resident)"
    finally:
        agent.stop()
        agent.remove_subtree()
