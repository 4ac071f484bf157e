"""A real agent against files it must not trust: a FIFO or a device link in its policy
directory never holds its main thread (SIGTERM is honoured within 1 s), and Logs returns only
output files its shim wrote."""

import os
import signal
import time

import pytest
from test_daemon_host import Agent, task_file

pytestmark = pytest.mark.host

GOOD = (
    "apiVersion: xh.scheduling/v1\nkind: SchedulingPolicy\nmetadata: {name: good}\n"
    "spec:\n  priority: 60\n  matchRules:\n    - selector: {matchLabels: {app: x}}\n"
)


@pytest.fixture
def idle_agent(tmp_path):
    """Not started: each test fills its policy directory first."""
    a = Agent(tmp_path, f"xhagent-untrusted-test-{os.getpid()}-{tmp_path.name[-12:]}.slice")
    yield a
    if a.proc is not None and a.proc.poll() is None:
        a.proc.kill()
        a.proc.wait()
    a.remove_subtree()


def events(agent: Agent, kind: str) -> list[str]:
    out = agent.cli("events", "--since", "0", check=True).stdout
    return [line for line in out.splitlines() if f" {kind}: " in line]


def stopped_within(agent: Agent, seconds: float) -> float:
    started = time.monotonic()
    agent.proc.send_signal(signal.SIGTERM)
    agent.proc.wait(timeout=10)
    took = time.monotonic() - started
    assert took < seconds, f"SIGTERM took {took:.2f}s: {agent.tail()}"
    return took


def test_a_fifo_and_a_device_link_at_start_are_refused_and_sigterm_still_stops_it(idle_agent):
    agent = idle_agent
    os.mkfifo(agent.policies / "fifo.yaml")
    (agent.policies / "zero.yaml").symlink_to("/dev/zero")
    (agent.policies / "good.yaml").write_text(GOOD)
    agent.start(timeout=30)
    rejected = events(agent, "PolicyRejected")
    assert any(f"{agent.policies / 'fifo.yaml'}: is a FIFO" in line for line in rejected)
    assert any(
        f"{agent.policies / 'zero.yaml'}: is a symbolic link leading outside" in line
        for line in rejected
    ), rejected
    assert any("SchedulingPolicy good" in line for line in events(agent, "PolicyLoaded"))
    stopped_within(agent, 1.0)
    assert agent.proc.returncode == 0, agent.tail()


@pytest.mark.parametrize("how", ["sighup", "watch"])
def test_a_fifo_appearing_at_a_reload_is_refused_and_sigterm_still_stops_it(idle_agent, how):
    agent = idle_agent
    agent.start(timeout=30)
    fifo = agent.policies / "late.yaml"
    if how == "watch":  # renamed in, as editors and `install` do: the watch reports it
        os.mkfifo(agent.policies / ".late.tmp")
        os.rename(agent.policies / ".late.tmp", fifo)
    else:
        os.mkfifo(fifo)
        agent.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 5
    while not (rejected := events(agent, "PolicyRejected")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert any(f"{fifo}: is a FIFO: only regular files are read" in r for r in rejected), rejected
    agent.proc.send_signal(signal.SIGHUP)  # a reload again, with the FIFO still there
    time.sleep(0.2)
    stopped_within(agent, 1.0)
    assert agent.proc.returncode == 0, agent.tail()


# The workload finds its run directory as its shim was told it (`--dir DIR`), waits for the
# shim to make its stdout file (at the stream's first byte), then puts a link to a root-only
# file where that file was; the shim keeps writing to the old one.
SWAP = (
    'dir=$(tr "\\0" "\\n" < /proc/$PPID/cmdline | sed -n "/^--dir$/{{n;p;}}"); '
    'echo before; while [ ! -e "$dir/stdout" ]; do sleep 0.01; done; '
    'rm "$dir/stdout"; ln {how} "$1" "$dir/stdout"; echo after'
)


@pytest.mark.parametrize("how", ["-s", ""], ids=["symlink", "hardlink"])
def test_logs_does_not_read_a_file_a_workload_put_in_place_of_its_output(idle_agent, tmp_path, how):
    agent = idle_agent
    agent.start(timeout=30)
    secret = tmp_path / "secret"  # the state dir's file system: a hard link can reach it
    secret.write_text("root-only-content\n")
    secret.chmod(0o600)
    spec = task_file(tmp_path, "swap", ["sh", "-c", SWAP.format(how=how), "sh", str(secret)])
    tid = agent.submit(spec)
    t = agent.wait(tid)
    assert t["state"] == "Succeeded", t
    stdout = agent.state / "tasks" / tid / "1" / "stdout"
    assert stdout.is_symlink() if how else stdout.stat().st_nlink == 2  # the swap happened
    res = agent.cli("logs", tid, "--stream", "stdout")
    assert "root-only-content" not in res.stdout + res.stderr
    assert res.returncode == 1, res
    kind = "a symbolic link" if how else "a file with 2 names (a hard link)"
    assert res.stderr == f"xhagent: {stdout}: {kind}, not the file the agent wrote: not read\n"
    assert "Traceback" not in agent.tail(200)
    assert agent.cli("get", tid).returncode == 0  # and it still serves


def test_a_resent_submit_with_the_clis_key_makes_no_duplicate(idle_agent, tmp_path):
    from xhagent.daemon.api import cli
    from xhagent.daemon.api.v1 import agent_pb2 as pb

    agent = idle_agent
    agent.start(timeout=30)
    spec = task_file(tmp_path, "once", ["sleep", "30"])
    request = pb.SubmitRequest(
        source=spec.read_text(), file_name=str(spec), idempotency_key=cli.submit_key("", str(spec))
    )
    with agent.client() as client:
        first = client.Submit(request).tasks
        again = cli.submit_with_retry(client, request)  # as after a lost reply
        assert [t.id for t in again.tasks] == [t.id for t in first]
        named = [t for t in client.List(pb.ListRequest(all=True)).tasks if t.name == "once"]
    assert [t.id for t in named] == [first[0].id]
    # two runs of the command are two submissions: each has a key of its own
    ids = {agent.submit(spec) for _ in range(2)}
    assert len(ids) == 2 and first[0].id not in ids


def test_logs_reads_the_output_of_a_workload_of_another_user(idle_agent, tmp_path):
    agent = idle_agent  # the shim writes as the agent whoever the workload runs as
    agent.start(timeout=30)
    spec = task_file(tmp_path, "nobody", ["sh", "-c", "id -u; echo oops >&2"], "  user: nobody\n")
    tid = agent.submit(spec)
    assert agent.wait(tid)["state"] == "Succeeded"
    res = agent.cli("logs", tid, check=True)
    assert res.stdout == "65534\n" and res.stderr == "oops\n"
