"""`trace record` without BPF: a stop before recording starts leaves nothing behind."""

import os
import signal

import pytest

from xhagent.signals import Terminated
from xhagent.trace import recorder


class LoadInterrupted:
    """A SchedTrace whose load is cut by SIGTERM (as a Ctrl-C during BPF load would be)."""

    def __init__(self):
        os.kill(os.getpid(), signal.SIGTERM)


def test_a_signal_during_bpf_load_leaves_the_output_as_it_was(tmp_path, monkeypatch):
    import xhagent.bpf.sched_trace as sched_trace

    monkeypatch.setattr(sched_trace, "SchedTrace", LoadInterrupted)
    path = tmp_path / "keep.xht"
    path.write_text("precious")
    with pytest.raises(Terminated) as exc:
        recorder.record(str(path), duration=1)
    assert exc.value.exit_code == 143
    assert path.read_text() == "precious" and os.listdir(tmp_path) == ["keep.xht"]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_an_empty_command_is_refused(tmp_path):
    with pytest.raises(ValueError, match="the command is empty"):
        recorder.record(str(tmp_path / "x"), command=[""])
    assert os.listdir(tmp_path) == []


def test_child_status_as_a_shell_reports_it():
    assert [recorder.shell_status(rc) for rc in (0, 3, -15, -9)] == [0, 3, 143, 137]
