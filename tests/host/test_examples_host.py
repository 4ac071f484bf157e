"""Every file in configs/examples/ is what its comment says it is: each Task example,
submitted to a real agent, runs to success or waits with the reason its comment names
(no GPU here: InsufficientGPUHardware); every other file passes `xhagent policy validate`."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from xhagent.bench.local_agent import LocalAgent

pytestmark = pytest.mark.host

XHAGENT = Path(sys.executable).with_name("xhagent")
EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "configs" / "examples").glob("*.yaml"))
ENDED = ("Succeeded", "Failed", "Cancelled")


def kinds(path: Path) -> set[str]:
    return {doc.get("kind") for doc in yaml.safe_load_all(path.read_text()) if doc}


def has_gpu() -> bool:
    return any(Path("/sys/bus/pci/drivers/nvidia").glob("0000:*"))


TASKS = [p for p in EXAMPLES if kinds(p) == {"Task"}]
OTHERS = [p for p in EXAMPLES if p not in TASKS]


def test_the_examples_are_there():
    assert {p.name for p in TASKS} >= {"task-hello.yaml", "task-infer.yaml"}
    assert len(OTHERS) >= 10


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    a = LocalAgent(tmp_path_factory.mktemp("examples"), f"xhagent-examples-{os.getpid()}.slice")
    a.start()
    yield a
    a.stop()
    a.remove_subtree()


def cli(agent, *args):
    return subprocess.run(
        [str(XHAGENT), *args, "--socket", str(agent.socket)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def settled(agent, task_id: str, timeout: float = 60.0) -> dict:
    """The task once it ended, or once it waits with a reason a step gave it."""
    deadline = time.monotonic() + timeout
    while True:
        t = json.loads(cli(agent, "get", task_id, "--json").stdout)
        looked_at = t["reasons"] and t["reasons"][0]["kind"] != "Queued"
        if t["state"] in ENDED or (t["state"] == "Pending" and looked_at):
            return t
        assert time.monotonic() < deadline, t
        time.sleep(0.1)


@pytest.mark.parametrize("path", TASKS, ids=lambda p: p.name)
def test_a_task_example_runs_or_waits_for_what_its_comment_names(agent, path):
    res = cli(agent, "submit", str(path))
    assert res.returncode == 0, res.stderr
    for task_id in (line.split()[0] for line in res.stdout.splitlines()):
        t = settled(agent, task_id)
        wants_gpu = t["device_type"] == "gpu"
        if wants_gpu and not has_gpu():
            assert t["state"] == "Pending", t
            assert "InsufficientGPUHardware" in {r["kind"] for r in t["reasons"]}, t
            assert "InsufficientGPUHardware" in path.read_text()  # what its comment says
            cli(agent, "cancel", task_id)
        else:
            assert t["state"] == "Succeeded", t
            assert cli(agent, "logs", task_id).stdout.strip(), "it said nothing"


@pytest.mark.parametrize("path", OTHERS, ids=lambda p: p.name)
def test_every_other_example_validates(path):
    res = subprocess.run(
        [str(XHAGENT), "policy", "validate", str(path)], capture_output=True, text=True
    )
    assert res.returncode == 0, res.stdout + res.stderr
