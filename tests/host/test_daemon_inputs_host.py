"""A real agent given what an adversary sends: every out-of-range field is INVALID_ARGUMENT
naming it and leaves no traceback in the agent's log; a task row corrupted with sqlite3 is
that task's problem alone (ps lists the others, get names task and column, the scheduling
loop carries on and reports it once), and a corrupted event or intent row that row's alone
(`events` shows it and goes on, a restart reports the intent and recovers the rest)."""

import os
import re
import sqlite3
import time
import urllib.request

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_daemon_host import Agent, task_file

from xhagent.daemon.api.client import ApiError
from xhagent.daemon.api.v1 import agent_pb2 as pb

pytestmark = pytest.mark.host

CLASS_NAME = re.compile(r"Traceback|<class|\b[A-Z][a-z]+(Error|Exception)\b")


@pytest.fixture
def agent(tmp_path):
    a = Agent(tmp_path, f"xhagent-inputs-test-{os.getpid()}-{tmp_path.name[-12:]}.slice")
    a.start()
    yield a
    a.stop()
    a.remove_subtree()


def internal_errors(agent) -> dict[str, float]:
    text = urllib.request.urlopen(agent.metrics_url(), timeout=10).read().decode()
    return {
        s.labels["where"]: s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "xhagent_internal_errors_total"
    }


# what the adversarial run sent, and the start of what the agent must answer
HOSTILE = [
    ("Watch", pb.WatchRequest(since_seq=2**63), "since_seq: at most 9223372036854775807"),
    ("Logs", pb.LogsRequest(id="t0000001", offset=2**64 - 1), "offset: at most"),
    ("List", pb.ListRequest(states=["Pending"] * 400_000), "states: at most 7"),
    ("Submit", pb.SubmitRequest(idempotency_key="k" * 254), "idempotency_key: at most 253 bytes"),
    ("Get", pb.GetRequest(id=""), "id: must not be empty"),
    ("Logs", pb.LogsRequest(id="t0000001", tail_lines=1_000_001), "tail_lines: at most"),
]


def test_out_of_range_fields_are_invalid_argument_and_leave_no_traceback(agent):
    with agent.client() as client:
        for method, request, details in HOSTILE:
            with pytest.raises(ApiError) as err:
                reply = getattr(client, method)(request)
                list(reply) if method in ("Watch", "Logs") else reply
            assert (err.value.code, str(err.value)[: len(details)]) == (
                "INVALID_ARGUMENT",
                details,
            ), method
    with grpc.insecure_channel(f"unix:{agent.socket}") as channel:
        with pytest.raises(grpc.RpcError) as err:
            channel.unary_unary("/xhagent.v1.Agent/Get")(b"\x0a\x02\xff\xfe", timeout=10)
    assert (err.value.code(), err.value.details()) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "id: not valid UTF-8",
    )
    for args, option in [
        (["events", "--since", "-5"], "'--since'"),
        (["events", "--since", "99999999999999999999999"], "'--since'"),
        (["get", "x" * 65], "'TASK_ID'"),
        (["submit", "--key", "k" * 254, "-"], "'--key'"),
    ]:
        res = agent.cli(*args)
        assert res.returncode == 2 and option in res.stderr, (args, res.stderr)
        assert not CLASS_NAME.search(res.stderr + res.stdout), res.stderr
    assert internal_errors(agent)["api"] == 0
    assert "Traceback" not in agent.log.read_text()


def test_a_corrupt_task_row_is_reported_for_that_task_only(agent, tmp_path):
    done = [agent.submit(task_file(tmp_path, f"ok-{i}", ["true"])) for i in range(3)]
    for tid in done:
        assert agent.wait(tid)["state"] == "Succeeded"
    # Pending for good (no node has 4096 CPUs): the scheduling loop looks at it every step
    waiting = agent.submit(task_file(tmp_path, "huge", ["true"], "  requests: {cpus: 4096}\n"))
    assert agent.wait(waiting, ("Pending",))["state"] == "Pending"
    assert agent.stop() == 0
    with sqlite3.connect(agent.state / "state.db") as db:
        db.execute("UPDATE tasks SET spec = '{not json' WHERE id = ?", (done[1],))
        db.execute("UPDATE tasks SET state = 'Exploded' WHERE id = ?", (done[2],))
        db.execute("UPDATE tasks SET reasons = '[1, 2' WHERE id = ?", (waiting,))
    agent.start()

    res = agent.cli("ps", "--all")
    assert res.returncode == 0, res.stderr
    rows = {line.split()[0]: line for line in res.stdout.splitlines()[1:]}
    assert set(rows) == {*done, waiting}, res.stdout
    assert " Succeeded " in rows[done[0]]
    assert " Unreadable " in rows[done[1]] and "column spec: not JSON" in rows[done[1]]
    assert "column state: 'Exploded' is not a task state" in rows[done[2]]
    assert "column reasons: not JSON" in rows[waiting]

    got = agent.cli("get", done[1])
    assert got.returncode == 1
    assert got.stderr.startswith(
        f"xhagent: task {done[1]}: its stored row is unreadable: column spec: not JSON"
    ), got.stderr
    assert agent.cli("get", done[0], check=True).stdout.startswith(f"{done[0]} ok-0: Succeeded")

    # the loop carries on: a new task runs, and the corrupt Pending row is reported once
    later = agent.submit(task_file(tmp_path, "later", ["true"]))
    assert agent.wait(later)["state"] == "Succeeded"
    time.sleep(1.5)  # a few more scheduling steps
    log = agent.log.read_text()
    assert log.count(f"task {waiting}: its stored row is unreadable") == 1, agent.tail(40)
    assert "Traceback" not in log, agent.tail(40)
    assert internal_errors(agent) == {"scheduler_step": 0, "policy_reload": 0, "api": 0}
    with agent.client() as client:
        assert client.Health(pb.HealthRequest()).status == "ok"


def test_a_running_task_whose_row_is_corrupted_keeps_running_through_a_restart(agent, tmp_path):
    tid = agent.submit(task_file(tmp_path, "sleeper", ["sleep", "300"]))
    assert agent.wait(tid, ("Running",))["state"] == "Running"
    leaf = agent.subtree_path / "tasks" / tid
    with sqlite3.connect(agent.state / "state.db") as db:  # while the agent runs
        db.execute('UPDATE tasks SET placement = \'{"cpus": "all"}\' WHERE id = ?', (tid,))
    got = agent.cli("get", tid)
    assert got.returncode == 1 and "column placement: " in got.stderr, got.stderr
    cancelled = agent.cli("cancel", tid)
    assert cancelled.returncode == 1 and "its stored row is unreadable" in cancelled.stderr
    # a restart cannot tell whether the leaf is the task's: it is kept, and so is its work
    assert agent.stop() == 0
    agent.start()
    pids = (leaf / "cgroup.procs").read_text().split()
    assert pids, "the workload of the unreadable task was killed"
    other = agent.submit(task_file(tmp_path, "other", ["true"]))
    assert agent.wait(other)["state"] == "Succeeded"
    assert "Traceback" not in agent.log.read_text(), agent.tail(40)
    assert internal_errors(agent)["scheduler_step"] == 0


def test_corrupt_event_and_intent_rows_stop_neither_the_event_stream_nor_a_restart(agent, tmp_path):
    tid = agent.submit(task_file(tmp_path, "ok", ["true"]))
    assert agent.wait(tid)["state"] == "Succeeded"
    assert agent.stop() == 0
    with sqlite3.connect(agent.state / "state.db") as db:
        (seq,) = db.execute("SELECT min(seq) FROM events WHERE task_id = ?", (tid,)).fetchone()
        db.execute("UPDATE events SET detail = '{not json' WHERE seq = ?", (seq,))
        # an intent a kill -9 left open, its arguments damaged on disk
        intent = db.execute(
            "INSERT INTO intents (task_id, action, args, created_ns) VALUES (?, 'kill', '{', 1)",
            (tid,),
        ).lastrowid
    agent.start()

    res = agent.cli("events", "--since", "0")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    shown = next(line for line in lines if line.split()[0] == str(seq))
    assert f" {tid} " in shown, shown
    assert f"Unreadable: event {seq}: its stored row is unreadable: column detail: not JSON" in (
        shown
    )
    said = next(line for line in lines if "IntentUnreadable" in line)
    assert f"intent {intent} of task {tid}: its stored row is unreadable: column args" in said
    assert "unreadable_intents=1" in [line for line in lines if "Recovered" in line][-1]
    later = agent.submit(task_file(tmp_path, "later", ["true"]))
    assert agent.wait(later)["state"] == "Succeeded"
    assert "Traceback" not in agent.log.read_text(), agent.tail(40)
    assert internal_errors(agent) == {"scheduler_step": 0, "policy_reload": 0, "api": 0}
