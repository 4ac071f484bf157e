"""A full state disk and output past the log cap, with a real agent: the state dir on a
2 MiB tmpfs the test mounts (and unmounts), a workload that writes more than fits, and
files of the test's own that use up the rest. No exit status is lost and task output
leaves the agent its reserve; a start that finds no space is refused naming ENOSPC; the
condition is one log line when it starts and one when it clears; what was dropped is
counted in `get`, `ps --json`, the events and the metrics."""

import errno
import json
import os
import re
import shutil
import time
import urllib.request

import pytest
from disks import small_tmpfs, use_up_blocks
from prometheus_client.parser import text_string_to_metric_families
from test_daemon_host import Agent, task_file

from xhagent.daemon.api.v1 import agent_pb2 as pb
from xhagent.daemon.exec.shim import AGENT_RESERVE

pytestmark = pytest.mark.host

MiB = 1 << 20
FULL_LINE = "state disk full: "
CLEARED_LINE = "state disk has room again"


def metrics(agent: Agent) -> dict[tuple[str, tuple], float]:
    text = urllib.request.urlopen(agent.metrics_url(), timeout=10).read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def events(agent: Agent, task_id: str) -> list[dict]:
    out = agent.cli("events", "--task", task_id, "--json", check=True).stdout
    return [json.loads(line) for line in out.splitlines()]


def wait_for(what, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while not (got := what()) and time.monotonic() < deadline:
        time.sleep(0.1)
    return got


@pytest.fixture
def small_agent(tmp_path):
    """An agent whose state dir is on a 2 MiB tmpfs of 1000 inodes."""
    with small_tmpfs(tmp_path / "small", "size=2m,nr_inodes=1000") as mnt:
        a = Agent(tmp_path, f"xhagent-disk-test-{os.getpid()}-{tmp_path.name[-12:]}.slice")
        a.state = mnt / "state"
        a.mount = mnt
        try:
            a.start()
            yield a
        finally:
            a.stop()
            a.remove_subtree()


def free_bytes(path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def use_up_inodes(folder) -> None:
    """Empty files in `folder` (the test's own) until the filesystem has no inode left."""
    folder.mkdir()
    try:
        for i in range(100_000):
            (folder / str(i)).touch()
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    else:
        pytest.fail("the inodes never ran out")


def test_a_workload_that_fills_the_state_disk_keeps_its_status_and_the_agent_its_room(
    small_agent, tmp_path
):
    a = small_agent
    # 3 MB to stdout on a 2 MiB disk, then exit 0
    big = a.submit(task_file(tmp_path, "big", ["sh", "-c", "head -c 3000000 /dev/zero; exit 0"]))
    t = a.wait(big)
    assert t["state"] == "Succeeded" and t["exit_code"] == 0, t
    kept = (a.state / "tasks" / big / "1" / "stdout").stat().st_size
    assert 0 < kept < 3_000_000
    assert int(t["output_dropped_bytes"]) == 3_000_000 - kept
    (dropped,) = [e for e in events(a, big) if e["kind"] == "OutputDropped"]
    assert dropped["detail"] == {
        "bytes": 3_000_000 - kept, "stdout": 3_000_000 - kept, "stderr": 0,
        "cap": 16 * MiB, "errno": errno.ENOSPC,
    }  # fmt: skip
    assert dropped["message"].endswith("the disk had no room for more (ENOSPC)"), dropped
    assert f"{3_000_000 - kept} bytes dropped" in a.cli("get", big, check=True).stdout
    # the output stopped short of the agent's reserve: the next task starts and is recorded
    assert free_bytes(a.mount) >= AGENT_RESERVE // 2
    assert a.wait(a.submit(task_file(tmp_path, "next", ["true"])))["state"] == "Succeeded"
    assert metrics(a)[("xhagent_state_disk_full", ())] == 0
    assert FULL_LINE not in a.log.read_text()


def test_a_full_state_disk_refuses_starts_naming_enospc_and_is_one_line_in_the_log(
    small_agent, tmp_path
):
    a = small_agent
    assert a.wait(a.submit(task_file(tmp_path, "before", ["true"])))["state"] == "Succeeded"
    # no inode left on the state disk (the store's files exist: it still commits)
    use_up_inodes(a.mount / "inodes")
    after = a.submit(task_file(tmp_path, "after", ["true"]))
    t = a.wait(after)
    assert t["state"] == "Failed", t
    assert t["error"].startswith(f"no space left on device (ENOSPC): {a.state / 'tasks' / after}")
    (failed,) = [e for e in events(a, after) if e["detail"].get("to") == "Failed"]
    assert failed["detail"]["error"] == t["error"]
    m = metrics(a)
    assert m[("xhagent_state_disk_full", ())] == 1
    assert m[("xhagent_state_disk_enospc_total", (("operation", "start"),))] == 1
    with a.client() as client:
        assert client.Health(pb.HealthRequest()).status.startswith("state disk full since")

    # no block left either: submissions are refused once the store has no room for them
    (a.mount / "inodes" / "0").unlink()
    use_up_blocks(a.mount / "blocks")
    for i in range(60):
        res = a.cli(
            "submit", str(task_file(tmp_path, f"w{i}", ["true"], "  requests: {cpus: 64}\n"))
        )
        if res.returncode != 0:
            assert "is full" in res.stderr and "Traceback" not in res.stderr, res.stderr
            break
    else:
        pytest.fail("the store never filled")
    time.sleep(3)  # the loop looks every second meanwhile: no line more in the log
    writes = ("xhagent_state_disk_enospc_total", (("operation", "write"),))
    failed_writes = metrics(a)[writes]
    assert failed_writes >= 1

    # what the test put there removed: the condition clears, in one line with the counts
    (a.mount / "blocks").unlink()
    shutil.rmtree(a.mount / "inodes")
    assert wait_for(lambda: CLEARED_LINE in a.log.read_text())
    log = a.log.read_text()
    assert log.count(FULL_LINE) == 1 and log.count(CLEARED_LINE) == 1, a.tail(40)
    assert "Traceback" not in log and "internal error" not in log, a.tail(40)
    (cleared,) = [line for line in log.splitlines() if CLEARED_LINE in line]
    counts = re.search(r"(\d+) start\(s\) refused, (\d+) write\(s\) failed", cleared)
    assert counts and (int(counts[1]), int(counts[2])) == (1, failed_writes), cleared
    m = metrics(a)
    assert m[("xhagent_state_disk_full", ())] == 0
    assert m[("xhagent_internal_errors_total", (("where", "scheduler_step"),))] == 0
    # and the agent starts tasks again
    assert a.wait(a.submit(task_file(tmp_path, "again", ["true"])))["state"] == "Succeeded"


def test_output_past_the_cap_is_counted_in_get_ps_events_and_metrics(tmp_path):
    a = Agent(tmp_path, f"xhagent-cap-test-{os.getpid()}-{tmp_path.name[-12:]}.slice")
    a.start()
    try:
        # 20 MiB to stdout, 1 KiB to stderr: the default cap is 16 MiB a stream
        script = "head -c 20971520 /dev/zero; head -c 1024 /dev/zero >&2"
        task_id = a.submit(task_file(tmp_path, "chatty", ["sh", "-c", script]))
        t = a.wait(task_id)
        assert t["state"] == "Succeeded", t
        assert int(t["output_dropped_bytes"]) == 4 * MiB
        run = a.state / "tasks" / task_id / "1"
        assert (run / "stdout").stat().st_size == 16 * MiB
        assert (run / "stderr").stat().st_size == 1024
        (listed,) = [
            x
            for x in json.loads(a.cli("ps", "--all", "--json", check=True).stdout)["tasks"]
            if x["id"] == task_id
        ]
        assert int(listed["output_dropped_bytes"]) == 4 * MiB
        assert f"{4 * MiB} bytes dropped" in a.cli("get", task_id, check=True).stdout
        (ev,) = [e for e in events(a, task_id) if e["kind"] == "OutputDropped"]
        assert ev["detail"] == {
            "bytes": 4 * MiB, "stdout": 4 * MiB, "stderr": 0, "cap": 16 * MiB, "errno": 0
        }  # fmt: skip
        assert ev["message"].startswith(f"{4 * MiB} bytes of output dropped (stdout {4 * MiB}")
        assert "capped at 16 MiB" in ev["message"] and "failed" not in ev["message"]
        m = metrics(a)
        assert m[("xhagent_task_output_dropped_bytes_total", (("class", "batch"),))] == 4 * MiB
        # a task within the cap drops nothing, and says so
        quiet = a.submit(task_file(tmp_path, "quiet", ["echo", "hi"]))
        assert int(a.wait(quiet)["output_dropped_bytes"]) == 0
        assert not [e for e in events(a, quiet) if e["kind"] == "OutputDropped"]
        assert "dropped" not in a.cli("get", quiet, check=True).stdout
    finally:
        a.stop()
        a.remove_subtree()
