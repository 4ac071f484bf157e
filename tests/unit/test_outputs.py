"""Output files are replaced whole or not at all, and nothing this run did not create
is ever removed."""

import os
import signal
import stat

import pytest

from xhagent.outputs import OutputError, atomic_output, write_all
from xhagent.signals import Terminated, terminate_on_signals


def test_a_new_file_appears_only_when_complete(tmp_path):
    path = tmp_path / "out"
    with atomic_output(str(path)) as out:
        write_all(out.fd, b"hello")
        assert not path.exists()
        assert stat.S_IMODE(os.fstat(out.fd).st_mode) == 0o600  # while incomplete
    assert path.read_bytes() == b"hello" and os.listdir(tmp_path) == ["out"]
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644 & ~mask


def test_a_failure_leaves_an_existing_file_untouched_and_no_temporary_file(tmp_path):
    path = tmp_path / "keep"
    path.write_bytes(b"precious")
    os.chmod(path, 0o640)
    with pytest.raises(RuntimeError):
        with atomic_output(str(path)) as out:
            write_all(out.fd, b"half")
            raise RuntimeError("failed half-way")
    assert path.read_bytes() == b"precious" and os.listdir(tmp_path) == ["keep"]
    with atomic_output(str(path)) as out:
        write_all(out.fd, b"new")
    assert path.read_bytes() == b"new" and stat.S_IMODE(path.stat().st_mode) == 0o640


def test_a_signal_leaves_nothing_behind(tmp_path):
    path = tmp_path / "keep"
    path.write_bytes(b"precious")
    with pytest.raises(Terminated):
        with terminate_on_signals(), atomic_output(str(path)) as out:
            write_all(out.fd, b"half")
            os.kill(os.getpid(), signal.SIGTERM)
    assert path.read_bytes() == b"precious" and os.listdir(tmp_path) == ["keep"]


@pytest.mark.parametrize(
    "path, kind", [("/dev/null", "a character device"), ("/tmp", "a directory")]
)
def test_what_is_not_a_regular_file_is_refused_and_left_alone(path, kind):
    before = os.stat(path)
    with pytest.raises(OutputError) as exc:
        with atomic_output(path):
            pytest.fail("nothing may be written")
    assert str(exc.value) == f"{path}: is {kind}; the output must be a regular file or a new name"
    after = os.stat(path)
    assert (after.st_ino, after.st_mode) == (before.st_ino, before.st_mode)


def test_a_fifo_is_refused(tmp_path):
    os.mkfifo(tmp_path / "p")
    with pytest.raises(OutputError, match="is a FIFO"):
        atomic_output(str(tmp_path / "p")).__enter__()


def test_a_missing_directory_is_refused(tmp_path):
    with pytest.raises(OutputError, match=f"directory {tmp_path}/no does not exist"):
        with atomic_output(str(tmp_path / "no" / "out")):
            pass


def test_a_symbolic_link_keeps_pointing_at_the_replaced_file(tmp_path):
    (tmp_path / "real").write_bytes(b"old")
    os.symlink("real", tmp_path / "link")
    with atomic_output(str(tmp_path / "link")) as out:
        write_all(out.fd, b"new")
    assert os.readlink(tmp_path / "link") == "real" and (tmp_path / "real").read_bytes() == b"new"
    os.symlink("/dev/null", tmp_path / "null")
    with pytest.raises(OutputError, match="null: is a character device"):
        atomic_output(str(tmp_path / "null")).__enter__()
