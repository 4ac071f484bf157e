"""A real agent against files it must not trust: a FIFO or a device link in its policy
directory never holds its main thread (SIGTERM is honoured within 1 s), and Logs returns only
output files its shim wrote."""

import os
import signal
import time

import pytest
from test_daemon_host import Agent

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
