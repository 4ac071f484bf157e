"""A SIGTERM during `xhagent run`'s start-up takes the one orderly way out, as a stop while
serving does: the agent says Stopping within a second, tells the service manager
STOPPING=1, closes what it opened and exits 0.

Start-up is slow here for the reason it is slow on a node that rebooted: its state dir
holds thousands of tasks recorded Running whose shims are gone, and recovery records each
one as lost (a few commits each: about a millisecond, seconds in all)."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from xhagent.bench.local_agent import LocalAgent
from xhagent.config import load_config
from xhagent.daemon.store import Placement, Store, TaskState, TaskSummary
from xhagent.inventory import build_model, discover_node

pytestmark = pytest.mark.host

TASKS = 3000


@pytest.fixture
def local(tmp_path):
    a = LocalAgent(tmp_path, f"xhagent-startup-stop-test-{os.getpid()}.slice", policies=False)
    yield a
    a.remove_subtree()


def recorded_running(state, count: int) -> None:
    """`count` tasks Running on this node, as a run that ended with the node left them."""
    node = build_model(discover_node(config=load_config(None))).name  # what the agent finds
    store = Store.open(state)
    try:
        with store.atomic():
            for i in range(count):
                doc = (
                    "apiVersion: xh.scheduling/v1\nkind: Task\n"
                    f"metadata: {{name: t{i}}}\n"
                    "spec:\n  deviceType: cpu\n  command: [sleep, '600']\n"
                )
                rec = store.submit(
                    name=f"t{i}", kind="cpu", source=doc, source_file="t.yaml",
                    summary=TaskSummary(document=0, task_class="batch", priority=0),
                )  # fmt: skip
                store.transition(rec.id, TaskState.STARTING, placement=Placement(node, (0,), False))
                store.transition(rec.id, TaskState.RUNNING, expect=TaskState.STARTING)
    finally:
        store.close()


def log_lines(local) -> list[dict]:
    text = local.log.read_text(errors="replace") if local.log.exists() else ""
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


@pytest.fixture
def manager(tmp_path):
    """A stand-in for systemd's notify socket."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp_path / "notify"))
    yield sock
    sock.close()


def start_into_recovery(local, env=None) -> subprocess.Popen:
    """`xhagent run` on `local`'s state, once it is recovering the tasks."""
    args = [sys.executable, "-m", "xhagent.cli", "run", "--state-dir", str(local.state),
            "--socket", str(local.socket), "--subtree", local.subtree,
            "--metrics-addr", "off", "--log-format", "json"]  # fmt: skip
    with open(local.log, "ab") as log:
        proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=log)
    # "Subtree" is said just before the policies and the recovery of the tasks
    deadline = time.monotonic() + 60
    while not any(line["message"].startswith("Subtree:") for line in log_lines(local)):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            pytest.fail(f"no start-up to stop: {local.tail()}")
        time.sleep(0.01)
    time.sleep(0.3)  # well into recovery, which takes seconds
    return proc


def test_sigterm_during_recovery_stops_in_order_and_exits_0(local, manager):
    recorded_running(local.state, TASKS)
    proc = start_into_recovery(local, dict(os.environ, NOTIFY_SOCKET=manager.getsockname()))
    try:
        sent, sent_at = time.time(), time.monotonic()
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=30)
        exited_in = time.monotonic() - sent_at
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert rc == 0, local.tail()
    lines = log_lines(local)
    messages = [line["message"] for line in lines]
    assert not any(m.startswith(("Recovered:", "Serving:")) for m in messages), local.tail()
    (stopping,) = [line for line in lines if line["message"].startswith("Stopping:")]
    assert stopping["message"] == "Stopping: SIGTERM during start-up: workloads keep running"
    assert stopping["ts"] - sent < 1.0, f"Stopping {stopping['ts'] - sent:.2f} s after SIGTERM"
    assert exited_in < 2.0, f"exited {exited_in:.2f} s after SIGTERM"
    manager.setblocking(False)
    assert manager.recv(4096) == b"STOPPING=1"  # and never READY=1
    with pytest.raises(BlockingIOError):
        manager.recv(4096)

    store = Store.open(local.state)  # closed in order: it opens again, nothing lost
    try:
        states = [t.state for t in store.each_task(list(TaskState))]
        assert len(states) == TASKS
        # stopped part-way through recovery: some recorded lost, the others for the next start
        assert TaskState.RUNNING in states and set(states) != {TaskState.RUNNING}, set(states)
        (last,) = store.events(store.last_event_seq() - 1)
        assert (last.kind, f"Stopping: {last.message}") == ("Stopping", stopping["message"])
    finally:
        store.close()


def test_sighup_during_recovery_is_a_reload_once_serving(local):
    recorded_running(local.state, TASKS)
    proc = start_into_recovery(local)
    try:
        proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 60
        while "Reload: SIGHUP: re-reading the policy directory" not in (
            messages := [line["message"] for line in log_lines(local)]
        ):
            assert proc.poll() is None and time.monotonic() < deadline, local.tail()
            time.sleep(0.05)
        assert [m.split(":")[0] for m in messages][-3:] == ["Recovered", "Serving", "Reload"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, local.tail()
        assert log_lines(local)[-1]["message"] == "Stopping: SIGTERM: workloads keep running"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
