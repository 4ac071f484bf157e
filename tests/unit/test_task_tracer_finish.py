"""A task's recording is finished off the agent's loop: end_later() hands it to the
tracer's thread and returns at once, the finishing one still counts towards the most
recordings at once, `then` hears of the outcome (figures or the error) from that thread,
and close() waits for what is being finished. The finishing itself (the ring's rest, the
stacks, fsync, rename) runs on a real recording in tests/host/test_daemon_trace_host.py."""

import threading
from types import SimpleNamespace

import pytest

from xhagent.daemon.exec import tracing
from xhagent.daemon.exec.tracing import MAX_RECORDINGS, TaskTracer


class Gate:
    """Stands in for TaskTracer._finish: blocks until let go, then answers or raises."""

    def __init__(self, error: OSError | None = None):
        self.go, self.entered, self.error = threading.Event(), threading.Event(), error
        self.threads: list[str] = []

    def __call__(self, rec):
        self.threads.append(threading.current_thread().name)
        self.entered.set()
        assert self.go.wait(10)
        if self.error is not None:
            raise self.error
        return {"path": f"/runs/{rec.task_id}/sched.xht", "events": 3, "lost": 0, "seconds": 0.5}


def live(*task_ids: str) -> dict:
    """Recordings as the tracer holds them: a ring the drain thread polls (nothing in it),
    and the task id the stand-in _finish reads."""
    ring = SimpleNamespace(poll=lambda timeout_ms: 0, flush=lambda: None)
    return {t: SimpleNamespace(task_id=t, sink=ring, maps=None) for t in task_ids}


@pytest.fixture
def tracer(monkeypatch):
    monkeypatch.setattr(tracing, "POLL_S", 0.01)
    t = TaskTracer()
    yield t
    t.close()


def test_end_later_returns_at_once_and_then_hears_from_the_tracer_thread(tracer):
    gate = Gate()
    tracer._finish = gate
    tracer._live = live("t0", "t1")
    told = []
    heard = threading.Event()

    def then(done, error):
        told.append((threading.current_thread().name, done, error))
        heard.set()

    assert tracer.end_later("t0", then) is True
    assert tracer.end_later("nope", then) is False  # no recording: nothing to finish
    assert not tracer.recording("t0")
    assert gate.entered.wait(10)
    assert told == []  # still being finished: the caller did not wait for it
    # being finished, it still holds its ring: with the other live one, the most at once
    tracer._live |= live(*(f"x{i}" for i in range(MAX_RECORDINGS - 2)))
    assert "the most at once" in tracer.begin("t-extra", None, None)
    gate.go.set()
    assert heard.wait(10)
    assert told == [("xhagent-traces", {"path": "/runs/t0/sched.xht", "events": 3,
                                        "lost": 0, "seconds": 0.5}, None)]  # fmt: skip
    assert gate.threads == ["xhagent-traces"]
    tracer._live.clear()


def test_a_failed_finish_is_told_and_close_waits_for_the_finishing(tracer):
    gate = Gate(OSError(28, "No space left on device"))
    tracer._finish = gate
    tracer._live = live("t0")
    told = []
    tracer.end_later("t0", lambda done, error: told.append((done, str(error))))
    assert gate.entered.wait(10)
    closing = threading.Thread(target=tracer.close)
    closing.start()
    closing.join(0.2)
    assert closing.is_alive()  # close() waits for the trace being finished
    gate.go.set()
    closing.join(10)
    assert not closing.is_alive()
    assert told == [(None, "[Errno 28] No space left on device")]


def test_a_failing_then_does_not_stop_the_tracer_thread(tracer):
    gate = Gate()
    gate.go.set()
    tracer._finish = gate
    tracer._live = live("t0", "t1")
    after = threading.Event()

    def boom(done, error):
        raise RuntimeError("the store refused the event")

    tracer.end_later("t0", boom)
    tracer.end_later("t1", lambda done, error: after.set())
    assert after.wait(10)  # the next one was finished and told all the same
