"""The policy directory's reader: regular files only, never a wait on a FIFO or a device,
links followed only inside the directory, the size bounded."""

import os
import signal
import stat
import time
from contextlib import contextmanager

import pytest

from xhagent.daemon.policies import files
from xhagent.daemon.policies.files import read_policy_file
from xhagent.daemon.policies.policy_set import PolicySet
from xhagent.daemon.policies.sources import PolicyError
from xhagent.daemon.store import Store
from xhagent.spec import MAX_BYTES

POLICY = (
    "apiVersion: xh.scheduling/v1\nkind: SchedulingPolicy\nmetadata: {name: p}\n"
    "spec:\n  priority: 60\n  matchRules:\n    - selector: {matchLabels: {app: x}}\n"
)


@contextmanager
def deadline(seconds: int):
    """A read that would block fails the test instead of hanging it."""

    def expired(*_):
        raise AssertionError(f"still blocked after {seconds}s")

    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def refused(directory, name) -> str:
    with deadline(2), pytest.raises(PolicyError) as caught:
        read_policy_file(directory, name)
    assert str(directory / name) in str(caught.value)
    return str(caught.value)


def test_a_regular_file_is_read(tmp_path):
    (tmp_path / "p.yaml").write_text(POLICY)
    assert read_policy_file(tmp_path, "p.yaml") == POLICY


def test_a_missing_file_or_a_dangling_link_is_no_file(tmp_path):
    (tmp_path / "dangling.yaml").symlink_to("nowhere.yaml")
    assert read_policy_file(tmp_path, "gone.yaml") is None
    assert read_policy_file(tmp_path, "dangling.yaml") is None
    assert read_policy_file(tmp_path / "no-such-dir", "p.yaml") is None


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    os.mkfifo(tmp_path / "f.yaml")
    started = time.monotonic()
    assert "is a FIFO: only regular files are read" in refused(tmp_path, "f.yaml")
    assert time.monotonic() - started < 1


def test_a_device_inside_the_directory_is_refused_unopened(tmp_path):
    if os.geteuid() != 0:
        pytest.fail("mknod needs root: run the unit tests as root, as `make test` does")
    os.mknod(tmp_path / "zero.yaml", 0o600 | stat.S_IFCHR, os.makedev(1, 5))  # /dev/zero's
    assert "is a character device" in refused(tmp_path, "zero.yaml")


def test_links_leaving_the_directory_are_refused(tmp_path):
    (tmp_path / "zero.yaml").symlink_to("/dev/zero")
    (tmp_path / "outside.yaml").write_text(POLICY)
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "up.yaml").symlink_to("../../outside.yaml")
    assert "leading outside the policy directory" in refused(tmp_path, "zero.yaml")
    assert "leading outside" in refused(tmp_path / "d", "up.yaml")


def test_a_configmap_layout_of_links_inside_the_directory_is_followed(tmp_path):
    (tmp_path / "..2026_12_01").mkdir()
    (tmp_path / "..2026_12_01" / "p.yaml").write_text(POLICY)
    (tmp_path / "..data").symlink_to("..2026_12_01")
    (tmp_path / "p.yaml").symlink_to("..data/p.yaml")
    assert read_policy_file(tmp_path, "p.yaml") == POLICY


def test_without_openat2_no_link_is_followed(tmp_path, monkeypatch):
    monkeypatch.setattr(files, "_openat2_missing", True)
    (tmp_path / "real.yaml").write_text(POLICY)
    (tmp_path / "p.yaml").symlink_to("real.yaml")
    assert "is a symbolic link" in refused(tmp_path, "p.yaml")
    assert read_policy_file(tmp_path, "real.yaml") == POLICY
    os.mkfifo(tmp_path / "f.yaml")
    assert "is a FIFO" in refused(tmp_path, "f.yaml")


def test_size_is_bounded_and_text_is_utf8(tmp_path):
    (tmp_path / "big.yaml").write_bytes(b"#" * (MAX_BYTES + 1))
    assert f"larger than {MAX_BYTES:,} bytes" in refused(tmp_path, "big.yaml")
    (tmp_path / "exact.yaml").write_bytes(b"#" * MAX_BYTES)
    assert len(read_policy_file(tmp_path, "exact.yaml")) == MAX_BYTES
    (tmp_path / "latin1.yaml").write_bytes(b"# caf\xe9\n")
    with pytest.raises(ValueError, match=r"latin1.yaml:1:6: not UTF-8"):
        read_policy_file(tmp_path, "latin1.yaml")


def test_a_fifo_replacing_a_policy_is_refused_and_its_previous_version_stays(tmp_path):
    store = Store.open(tmp_path / "state")
    seen: list[tuple[str, str]] = []
    directory = tmp_path / "policies.d"
    directory.mkdir()
    ps = PolicySet(directory, store, lambda: 1, lambda kind, msg: seen.append((kind, msg)))
    try:
        (directory / "p.yaml").write_text(POLICY)
        assert ps.reload() is True
        (directory / "p.yaml").unlink()
        os.mkfifo(directory / "p.yaml")
        with deadline(2):
            assert ps.reload({"p.yaml"}) is False
        assert [p.priority for p in ps.scheduling()] == [60]
        assert seen[-1] == (
            "PolicyRejected",
            f"{directory / 'p.yaml'}: is a FIFO: only regular files are read "
            "(the previous version stays in force)",
        )
    finally:
        store.close()
