"""`spec.trace: true`: the agent records each attempt's scheduler events by eBPF, filtered
on the task's leaf, into `<state>/tasks/<id>/<attempt>/sched.xht`; the trace tools read it;
the agent's /metrics counts the events; a kill -9 leaves a partial file the tools read as
an unfinished recording."""

import json
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_daemon_host import Agent, task_file

from xhagent.daemon.exec.tracing import MAX_RECORDINGS, TaskTracer
from xhagent.trace.fmt import TraceFile

pytestmark = pytest.mark.host

TRACE = "  trace: true\n"
SCRIPT = "for i in 1 2 3; do sleep 0.05; done; echo done"


@pytest.fixture
def agent(tmp_path):
    a = Agent(tmp_path, f"xhagent-trace-test-{tmp_path.name[-12:]}.slice")
    a.start()
    yield a
    a.stop()
    a.remove_subtree()


def trace_stats(path: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "xhagent.cli", "trace", "stats", str(path), "--json", *extra],
        capture_output=True,
        text=True,
        timeout=60,
    )


def events(agent: Agent, tid: str) -> str:
    return agent.cli("events", "--task", tid, check=True).stdout


def recorded(agent: Agent, tid: str, timeout: float = 30.0) -> str:
    """The task's events once its trace is finished: the agent's trace thread finishes it
    after the task ended, and says so (TraceRecorded) once the file is in place."""
    deadline = time.monotonic() + timeout
    while "TraceRecorded: " not in (text := events(agent, tid)):
        assert time.monotonic() < deadline, f"no TraceRecorded in {timeout:g} s:\n{text}"
        time.sleep(0.05)
    return text


def test_a_traced_task_leaves_a_trace_of_its_own_processes_only(agent, tmp_path):
    tid = agent.submit(task_file(tmp_path, "traced", ["sh", "-c", SCRIPT], TRACE))
    assert agent.wait(tid)["state"] == "Succeeded"
    path = agent.state / "tasks" / tid / "1" / "sched.xht"
    assert str(path) in recorded(agent, tid)
    assert path.is_file() and not path.with_name("sched.xht.partial").exists()
    got = trace_stats(path)
    assert got.returncode == 0, got.stderr
    stats = json.loads(got.stdout)
    assert stats["filter"] == "cgroup" and stats["lost"] == 0
    comms = {t["comm"] for t in stats["tasks"]}
    # the shell and its three sleeps, and the shim's child before it became the shell:
    # nothing of the agent, of the shim itself or of anything else on the node
    assert {"sh", "sleep"} <= comms <= {"sh", "sleep", "xhagent-shim"}, comms
    assert sum(1 for t in stats["tasks"] if t["comm"] == "sleep") == 3

    text = urllib.request.urlopen(agent.metrics_url(), timeout=10).read().decode()
    samples = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    assert samples["xhagent_trace_events_total"] == stats["events"] > 0
    assert samples["xhagent_traces_finished_total"] == 1
    assert samples["xhagent_traces_recording"] == 0


def test_a_task_traced_with_stacks_says_where_it_waited(agent, tmp_path):
    stacks = TRACE + "  traceStacks: both\n"
    tid = agent.submit(task_file(tmp_path, "stacks", ["sh", "-c", SCRIPT], stacks))
    assert agent.wait(tid)["state"] == "Succeeded"
    recorded(agent, tid)
    # one command, from the task's id: the agent names its trace (TraceRecorded's detail)
    res = agent.cli("trace", "offcpu", "--task", tid, "--json")
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout)["stacks"]
    # the three sleeps: each off CPU ~50 ms in nanosleep, the shell meanwhile in wait()
    naps = [s for s in got if s["comm"] == "sleep" and "do_nanosleep" in s["frames"]]
    assert len(naps) == 3 and all(s["off_cpu_us"] >= 40_000 for s in naps), got
    assert any(s["comm"] == "sh" and "do_wait" in s["frames"] for s in got), got
    # and their user stacks: the sleeps in the C library's nanosleep, named from its symbols
    # (unless the stack map had no room for one: a bucket taken is counted lost)
    user = [s["frames"][s["frames"].index("entry_SYSCALL_64_after_hwframe") + 1 :] for s in naps]
    named = sum(1 for u in user if u and "nanosleep" in u[0])
    lost = TraceFile(agent.state / "tasks" / tid / "1" / "sched.xht").header.meta["stacks"]["lost"]
    assert named and named + lost >= 3, (user, lost)
    plain = agent.submit(task_file(tmp_path, "plain", ["true"]))
    assert agent.wait(plain)["state"] == "Succeeded"
    res = agent.cli("trace", "offcpu", "--task", plain)
    assert res.returncode == 2 and f"task {plain} has no finished trace" in res.stderr
    res = agent.cli("trace", "offcpu", "--task", "")  # not every task's events
    assert res.returncode == 2 and "--task" in res.stderr, res.stderr
    # a stack needs a trace to be taken in
    bad = task_file(tmp_path, "bad", ["true"], "  traceStacks: kernel\n")
    res = agent.cli("submit", str(bad))
    assert res.returncode == 2 and "traceStacks" in res.stderr and "trace: true" in res.stderr


def test_an_untraced_task_has_no_trace_and_a_cancelled_one_is_finished(agent, tmp_path):
    plain = agent.submit(task_file(tmp_path, "plain", ["true"]))
    assert agent.wait(plain)["state"] == "Succeeded"
    assert not list((agent.state / "tasks" / plain).rglob("sched.xht*"))
    long = agent.submit(
        task_file(tmp_path, "long", ["sh", "-c", "while :; do sleep 0.01; done"], TRACE)
    )
    assert agent.wait(long, ("Running",))["state"] == "Running"
    time.sleep(0.3)
    agent.cli("cancel", long, check=True)
    recorded(agent, long)
    stats = json.loads(trace_stats(agent.state / "tasks" / long / "1" / "sched.xht").stdout)
    assert stats["events"] > 10


def test_after_a_kill_9_the_cut_trace_is_kept_and_read_as_unfinished(agent, tmp_path):
    tid = agent.submit(
        task_file(tmp_path, "cut", ["sh", "-c", "while :; do sleep 0.01; done"], TRACE)
    )
    assert agent.wait(tid, ("Running",))["state"] == "Running"
    time.sleep(1.5)  # the drain thread has flushed records to the file (once a second)
    agent.proc.send_signal(signal.SIGKILL)
    agent.proc.wait(10)
    partial = agent.state / "tasks" / tid / "1" / "sched.xht.partial"
    assert partial.is_file() and not partial.with_name("sched.xht").exists()
    got = trace_stats(partial)
    assert got.returncode == 0, got.stderr
    assert "recording did not finish" in got.stderr
    assert json.loads(got.stdout)["events"] > 0  # flushed at least once a second
    agent.start()  # the task is adopted and goes on untraced; cancelling it ends it
    agent.cli("cancel", tid, check=True)
    assert "TraceRecorded" not in events(agent, tid)
    assert partial.is_file()  # never removed: the only record of that run


def test_a_trace_beyond_the_most_at_once_is_refused_with_why(tmp_path):
    tracer = TaskTracer()
    tracer._live = {f"t{i}": object() for i in range(MAX_RECORDINGS)}
    why = tracer.begin("t-extra", tmp_path, tmp_path)
    assert why == f"{MAX_RECORDINGS} traces are recording already (the most at once)"
    assert list(tmp_path.iterdir()) == []
