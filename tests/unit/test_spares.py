"""Spare run directories without root: the shim's real maker (`xhagent-shim --make-spares`) in
a scratch dir, and the pool that hands them out (exec/spares.py). The shim taking one by its
rename is in tests/host/test_spares_host.py."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from xhagent.daemon.exec import spares as spares_mod
from xhagent.daemon.exec.shim import RECORD_SIZE, SHIM
from xhagent.daemon.exec.spares import QUIET_S, SpareRunDirs


def make(dir_: Path, *args: str) -> subprocess.CompletedProcess:
    argv = [str(SHIM), "--make-spares", str(dir_), *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def names(dir_: Path) -> list[str]:
    return sorted(os.listdir(dir_))


def test_the_maker_makes_whole_spares_up_to_its_count_and_no_more(tmp_path):
    pool = tmp_path / "spare"
    done = make(pool, "--count", "3", "--keep-free", "0")
    assert done.returncode == 0, done.stderr
    made = names(pool)
    assert len(made) == 3 and not any(n.startswith(".") for n in made)
    for name in made:
        attempt = pool / name / "1"
        assert sorted(os.listdir(pool / name)) == ["1"]
        assert sorted(os.listdir(attempt)) == ["exit.tmp", "started.tmp"]
        for record in ("started.tmp", "exit.tmp"):
            data = (attempt / record).read_bytes()
            assert data == b" " * RECORD_SIZE  # the reservation, as the shim writes it
    again = make(pool, "--count", "5", "--keep-free", "0")
    assert again.returncode == 0
    assert len(names(pool)) == 5 and set(made) <= set(names(pool))


def test_the_maker_removes_what_a_maker_left_half_made_and_nothing_else(tmp_path):
    pool = tmp_path / "spare"
    half = pool / ".making-x" / "1"
    half.mkdir(parents=True)
    (half / "started.tmp").write_bytes(b" " * 10)
    done = make(pool, "--count", "1", "--keep-free", "0")
    assert done.returncode == 0, done.stderr
    assert not (pool / ".making-x").exists() and len(names(pool)) == 1
    # one holding a file it never makes is not its own: left, and said
    odd = pool / ".making-y" / "1"
    odd.mkdir(parents=True)
    (odd / "keep.me").write_text("not the maker's")
    refused = make(pool, "--count", "2", "--keep-free", "0")
    assert refused.returncode == 1
    assert "remove" in refused.stderr and ".making-y" in refused.stderr
    assert (odd / "keep.me").read_text() == "not the maker's"


def test_the_maker_stops_short_of_the_disks_last_bytes(tmp_path):
    pool = tmp_path / "spare"
    st = os.statvfs(tmp_path)
    free = st.f_bavail * st.f_frsize
    done = make(pool, "--count", "4", "--keep-free", str(free + (1 << 30)))
    assert done.returncode == 3 and names(pool) == []


@pytest.mark.parametrize(
    "args",
    [(), ("--count", "x", "--keep-free", "0"), ("--count", "-1"), ("--count", "2", "--keep")],
)
def test_a_bad_maker_command_line_is_refused_with_its_usage(tmp_path, args):
    done = make(tmp_path / "spare", *args)
    assert done.returncode == 2 and done.stderr.startswith("usage: xhagent-shim --make-spares")
    assert not (tmp_path / "spare").exists()


def wait_ready(pool: SpareRunDirs, want: int, timeout: float = 30.0) -> int:
    deadline = time.monotonic() + timeout
    while (ready := pool.ready()) < want and time.monotonic() < deadline:
        time.sleep(0.05)
    return ready


def test_the_pool_is_made_once_starts_are_quiet_and_hands_each_spare_out_once(tmp_path):
    pool = SpareRunDirs(tmp_path, 4, SHIM)
    assert pool.take() is None  # nothing made yet: the start makes its own
    due = pool.tick()
    assert due is not None and 0 < due <= QUIET_S  # not while starts ask for spares
    time.sleep(due)
    assert pool.tick() is None  # started
    assert wait_ready(pool, 4) == 4
    given = [pool.take() for _ in range(4)]
    assert len(set(given)) == 4 and all(p.parent == tmp_path / "spare" for p in given)
    assert pool.take() is None and pool.taken == 4
    time.sleep(QUIET_S)
    pool.tick()
    assert wait_ready(pool, 4) == 4  # made up again: the four given are still there,
    # as nothing renamed them, and are counted with the new ones
    pool.close()


def test_a_start_stops_the_maker_at_work(tmp_path):
    pid_file = tmp_path / "maker.pid"
    slow = tmp_path / "slow-maker"
    slow.write_text(f"#!/bin/sh\necho $$ > {pid_file}\nexec sleep 60\n")
    slow.chmod(0o755)
    pool = SpareRunDirs(tmp_path, 8, slow)
    assert pool.fill(0.5) == 0  # (it did not end in time: stopped)
    pid_file.unlink(missing_ok=True)
    assert pool.tick() is None  # no start asked for one: a maker again, at once
    deadline = time.monotonic() + 10
    while not pid_file.exists() or not pid_file.read_text().strip():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    maker = int(pid_file.read_text())
    pid_file.unlink()
    assert state_of(maker) not in ("Z", None)
    assert pool.take() is None
    deadline = time.monotonic() + 10
    while state_of(maker) not in ("Z", None):  # killed; reaped by the pool's next look
        assert time.monotonic() < deadline
        time.sleep(0.02)
    pool.close()
    assert state_of(maker) is None


def state_of(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return None


def test_a_maker_that_fails_is_said_once_and_tried_again_later(tmp_path, caplog):
    pool = SpareRunDirs(tmp_path, 2, tmp_path / "no-such-shim")
    pool._asked = float("-inf")
    assert pool.tick() is None
    assert "no-such-shim" in pool.last_error
    assert pool.tick() == pytest.approx(spares_mod.RETRY_S, abs=1)
    assert pool.take() is None
    warned = [r for r in caplog.records if "spare run directories" in r.getMessage()]
    assert len(warned) == 1 and "starts make their own" in warned[0].getMessage()


def test_a_maker_stopped_for_the_disks_space_is_said_with_the_free_space_it_keeps(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(spares_mod, "KEEP_FREE", 1 << 60)
    pool = SpareRunDirs(tmp_path, 2, SHIM)
    assert pool.fill(30) == 0
    said = f"0 ready, none more while the state disk has under {1 << 40} MiB free"
    assert pool.last_error == said
    assert pool.tick() == pytest.approx(spares_mod.RETRY_S, abs=1)


def test_no_pool_makes_nothing_and_gives_nothing(tmp_path):
    pool = SpareRunDirs(tmp_path, 0, SHIM)
    assert (pool.take(), pool.tick(), pool.ready(), pool.fill(1)) == (None, None, 0, 0)
    assert not (tmp_path / "spare").exists()
    with pytest.raises(ValueError):
        SpareRunDirs(tmp_path, -1, SHIM)
