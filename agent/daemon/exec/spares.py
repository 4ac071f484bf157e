"""Spare run directories: a task's run directory and its records' reservations, made before
the task starts, while the node is idle.

A first attempt's run directory (`STATE/tasks/ID/1`, its two reserved record files) costs
the state disk four inodes. On ext4 without a journal an inode's allocation passes over
every inode deleted in the last minute: making them took 0.5-3.6 ms of kernel CPU a task
on this project's machines (docs/benchmarks.md), on the path of every start. Renaming a
directory made beforehand costs none of it: the shim takes a spare (`--spare`) by renaming
it to `STATE/tasks/ID`, with the attempt's directory and reservations in it already.

`SpareRunDirs` owns `STATE/spare`: it hands each spare out once (`take`), and makes the pool
up with the shim's maker (`xhagent-shim --make-spares`, shim_spares.c) while no start needs
the disk: `tick` starts it once no spare was asked for in QUIET_S (at most one at a time;
after one that failed or stopped for the disk's space, not for RETRY_S), and the next start
kills it. The maker runs at the idle scheduling class, and would hold the pool directory's
lock where a start's rename needs it: beside a burst it made the starts slower, not faster
(docs/benchmarks.md). What it made is looked at once it ended. A start that finds no spare
makes its directory itself, as without the pool. A spare handed out twice (to a start that
failed before its shim took it, then again after a look) is harmless: the shim's rename is
atomic and never replaces a directory, and the shim that finds it gone makes its own.
"""

from __future__ import annotations

import logging
import os
import subprocess
import threading
import time
from pathlib import Path

SPARE = "spare"  # below the state dir
DEFAULT_SPARES = 1024  # 16 MiB of the state disk (two 8 KiB reservations a spare)
KEEP_FREE = 64 << 20  # the maker leaves the state disk at least this much
RETRY_S = 10.0  # after a maker that failed or stopped for the disk's space
QUIET_S = 1.0  # no start asked for a spare this long: the maker may run
STOPPED_FOR_SPACE = 3  # the maker's exit status (shim_spares.c)

log = logging.getLogger("xhagent")


class SpareRunDirs:
    def __init__(self, state_dir: Path, level: int, shim: Path):
        if level < 0:
            raise ValueError(f"spare run directories: {level} is below 0")
        self.dir = state_dir / SPARE
        self.level = level  # 0: none are made, and every start makes its own
        self._shim = shim
        self._ready: list[str] = []  # not handed out, as of the last look
        self._looked = False
        self._maker: subprocess.Popen | None = None
        self._killed: list[subprocess.Popen] = []  # makers a start killed, to be reaped
        self._asked = float("-inf")  # (monotonic) when a start last asked for one
        self._next_try = 0.0  # (monotonic) no maker is started before
        self.taken = 0  # spares handed out since the agent started
        self.last_error: str | None = None  # what the maker's last run said, if it failed
        # the loop's starts and the metrics' scrapes
        self._lock = threading.Lock()

    def take(self) -> Path | None:
        """A spare handed out to no one else, to rename into place (None: none is ready);
        a maker at work is stopped (SIGKILL: what it left half made, the next removes)."""
        if self.level == 0:
            return None
        with self._lock:
            self._asked = time.monotonic()
            if self._maker is not None:
                self._maker.kill()
                self._killed.append(self._maker)
                self._maker = None
            self._reap()
            if not self._looked:
                self._look()
            if not self._ready:
                return None
            self.taken += 1
            return self.dir / self._ready.pop()

    def tick(self) -> float | None:
        """The maker started where the pool is short and no start asked for a spare in
        QUIET_S; the seconds until it would be (None: it runs, or nothing is to be made)."""
        if self.level == 0:
            return None
        with self._lock:
            self._reap()
            if not self._looked:
                self._look()
            if self._maker is not None or len(self._ready) >= self.level:
                return None
            now = time.monotonic()
            due = max(self._asked + QUIET_S, self._next_try)
            if now < due:
                return due - now
            self._start()
            return None

    def ready(self) -> int:
        """Spares ready to be handed out (those a maker is making are counted once it
        ended)."""
        with self._lock:
            self._reap()
            return len(self._ready)

    def fill(self, timeout: float) -> int:
        """The maker run now and awaited (at most `timeout` seconds; then stopped): for a
        benchmark that measures starts with the pool as an idle node has it. The spares
        ready."""
        with self._lock:
            self._reap()
            if self._maker is None and self.level:
                self._start()
            if self._maker is not None:
                try:
                    self._maker.wait(timeout)
                except subprocess.TimeoutExpired:
                    self._maker.kill()
                    self._killed.append(self._maker)
                    self._maker = None
            self._reap()
            self._look()
            return len(self._ready)

    def close(self) -> None:
        """The maker stopped and reaped, if it runs."""
        with self._lock:
            if self._maker is not None:
                self._maker.kill()
                self._killed.append(self._maker)
                self._maker = None
            for maker in self._killed:
                maker.wait()
                _close_stderr(maker)
            self._killed = []

    def _start(self) -> None:
        argv = [str(self._shim), "--make-spares", str(self.dir)]
        argv += ["--count", str(self.level), "--keep-free", str(KEEP_FREE)]
        try:
            self._maker = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                close_fds=True,
            )
        except OSError as exc:
            self._failed(f"{argv[0]}: {exc.strerror or exc}")
            self._next_try = time.monotonic() + RETRY_S

    def _reap(self) -> None:
        """Makers that ended: killed ones let go, and what the last one made looked at."""
        self._killed = [m for m in self._killed if m.poll() is None or _close_stderr(m)]
        if self._maker is None or self._maker.poll() is None:
            return
        maker, self._maker = self._maker, None
        said = maker.stderr.read(4096).decode(errors="replace").strip() if maker.stderr else ""
        _close_stderr(maker)
        self._look()
        if maker.returncode == 0:
            self.last_error = None
            return
        if maker.returncode == STOPPED_FOR_SPACE:
            said = f"{len(self._ready)} ready, none more while the state disk has under "
            said += f"{KEEP_FREE >> 20} MiB free"
        self._failed(said or f"the maker exited with {maker.returncode}")
        self._next_try = time.monotonic() + RETRY_S

    def _look(self) -> None:
        """The spares there now (the maker makes each under a dot name, renamed once whole)."""
        self._looked = True
        try:
            with os.scandir(self.dir) as entries:
                names = [e.name for e in entries if not e.name.startswith(".")]
        except FileNotFoundError:
            names = []
        except OSError as exc:
            self._failed(f"{self.dir}: {exc.strerror or exc}")
            names = []
        self._ready = sorted(names)

    def _failed(self, why: str) -> None:
        if why != self.last_error:
            log.warning("spare run directories: %s; starts make their own", why)
        self.last_error = why


def _close_stderr(maker: subprocess.Popen) -> bool:
    if maker.stderr:
        maker.stderr.close()
    return False
