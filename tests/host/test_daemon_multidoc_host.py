"""Multi-document submissions on a real agent: the state dir grows linearly with the file,
every task starts or says why it waits (also after a kill -9), `ps` pages newest first,
and the CLI and the agent refuse the same over-limit files, exit 2."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from xhagent.bench.agent import census, multidoc_case, multidoc_within
from xhagent.bench.local_agent import LocalAgent
from xhagent.spec import MAX_DOCUMENTS

pytestmark = pytest.mark.host

XHAGENT = Path(sys.executable).with_name("xhagent")


@pytest.fixture
def agent(tmp_path):
    a = LocalAgent(tmp_path, f"xhagent-multidoc-test-{os.getpid()}-{tmp_path.name[-12:]}.slice")
    a.start()
    yield a
    a.stop()
    a.remove_subtree()


def cli(agent, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(XHAGENT), *args, "--socket", str(agent.socket)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def first_reason(agent, task_id: str) -> str:
    reasons = json.loads(cli(agent, "get", task_id, "--json").stdout)["reasons"]
    return reasons[0]["kind"] if reasons else ""


def documents(n: int, extra: str = "", command: str = '["true"]') -> str:
    return "---\n".join(
        f"apiVersion: xh.scheduling/v1\nkind: Task\nmetadata: {{name: d{i}}}\n"
        f"spec:\n  deviceType: cpu\n  command: {command}\n{extra}"
        for i in range(n)
    )


def test_2000_documents_grow_the_state_linearly_and_all_of_them_run(agent):
    case = multidoc_case(agent, 2000, ["true"])
    assert case["tasks"] == 2000
    # each task keeps its own document: twice the file and a fixed cost a task at most
    # (each keeping the whole file was 2000 x 222 KB = 445 MB)
    assert multidoc_within(case), case
    assert case["silent_pending_max"] == 0, case  # every Pending task said why it waited
    with agent.client() as c:
        assert census(c) == {"silent": 0}  # nothing left that has not ended
    page = json.loads(cli(agent, "ps", "--all", "--json", "--limit", "1").stdout)
    assert page["total"] == 2000 and page["tasks"][0]["name"] == "m1999"  # the newest
    assert page["tasks"][0]["state"] == "Succeeded"


def test_tasks_that_cannot_start_all_say_why_and_still_do_after_a_kill_9(agent, tmp_path):
    # 1,200 tasks that fit nowhere: more than a step's scan window of 1,000
    path = tmp_path / "wide.yaml"
    path.write_text(documents(1200, "  requests: {cpus: 512}\n", '["sleep", "600"]'))
    submitted = cli(agent, "submit", str(path))
    assert submitted.returncode == 0, submitted.stderr
    oldest = submitted.stdout.split()[0]
    for restarted in (False, True):
        if restarted:
            agent.stop(signal.SIGKILL)
            agent.start()
        deadline = time.monotonic() + 60
        while first_reason(agent, oldest) != "InsufficientCPU":  # a step looked at it
            assert time.monotonic() < deadline, first_reason(agent, oldest)
            time.sleep(0.2)
        with agent.client() as c:
            assert census(c) == {"silent": 0, "Pending": 1200}
        # ps pages through them, newest first, and says there are more
        seen, token = [], ""
        while True:
            args = ["ps", "--json", "--limit", "500"] + (["--page-token", token] if token else [])
            page = json.loads(cli(agent, *args).stdout)
            assert page["total"] == 1200
            seen += page["tasks"]
            token = page["next_page_token"]
            if not token:
                break
        assert [t["name"] for t in seen] == [f"d{i}" for i in range(1199, -1, -1)]
        assert all(t["reasons"] for t in seen)
        kinds = {t["reasons"][0]["kind"] for t in seen}
        assert kinds <= {"InsufficientCPU", "Queued"} and "InsufficientCPU" in kinds
    shown = cli(agent, "ps", "--limit", "2")
    assert shown.returncode == 0 and len(shown.stdout.splitlines()) == 3  # header and two
    assert shown.stderr.startswith("showing the newest 2 of 1200 tasks; --page-token t")
    bad = cli(agent, "ps", "--page-token", "nonsense")
    assert bad.returncode == 2 and "page_token" in bad.stderr and "Traceback" not in bad.stderr


def test_validate_submit_and_apply_refuse_the_same_file_exit_2(agent, tmp_path):
    too_many = tmp_path / "many.yaml"
    too_many.write_text(documents(MAX_DOCUMENTS + 1))
    where = f"{too_many}:{7 * MAX_DOCUMENTS}:1: more than 10,000 documents"
    for args in (
        ["policy", "validate", str(too_many)],
        ["submit", "--socket", str(agent.socket), str(too_many)],
        ["apply", "--socket", str(agent.socket), "-f", str(too_many)],
    ):
        got = subprocess.run([str(XHAGENT), *args], capture_output=True, text=True, timeout=300)
        assert got.returncode == 2, (args, got.stderr)
        assert where in got.stderr and "Traceback" not in got.stderr, (args, got.stderr)
    huge = tmp_path / "huge.yaml"
    huge.write_text("#" * (4 << 20) + "\n")
    for args in (
        ["policy", "validate", str(huge)],
        ["submit", "--socket", str(agent.socket), str(huge)],
    ):
        got = subprocess.run([str(XHAGENT), *args], capture_output=True, text=True, timeout=60)
        assert got.returncode == 2 and "4,194,304 bytes" in got.stderr, (args, got.stderr)
    with agent.client() as c:
        assert census(c) == {"silent": 0}  # nothing of them was submitted
