"""The known workload of the tracing tests and benchmark: two processes bounce a
byte over two pipes `rounds` times, so each blocks in read() (prev_state=S) once
per round. Run as `python -m xhagent.trace.workload ROUNDS [--pin none|same|split]`; it prints
`{"ping": PID, "pong": PID, "rounds": N, "elapsed_s": S}` (the loop's
wall time) as JSON on stdout.

`build_c` builds the same workload in C (pingpong.c) with frame pointers, for user stacks
that a tracer can take whole: CPython keeps none, so a Python workload's user stacks stop
after a frame or two."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

PING, PONG = "xh-ping", "xh-pong"


def _name(comm: str) -> None:
    with open("/proc/self/comm", "w") as f:
        f.write(comm)


def _cpus(pin: str) -> tuple[set[int] | None, set[int] | None]:
    """Affinity of (ping, pong): one CPU for both (each switch goes straight from one
    to the other), two different CPUs (cross-CPU wakeups), or whatever the kernel picks.
    Unpinned timings are bimodal: they depend on where the kernel happens to put them."""
    allowed = sorted(os.sched_getaffinity(0))
    if pin == "none" or len(allowed) < 2 and pin == "split":
        return None, None
    if pin == "same":
        return {allowed[0]}, {allowed[0]}
    return {allowed[0]}, {allowed[1]}


def ping_pong(rounds: int, pin: str = "none") -> dict:
    ping_cpus, pong_cpus = _cpus(pin)
    a_r, a_w = os.pipe()
    b_r, b_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            _name(PONG)
            if pong_cpus:
                os.sched_setaffinity(0, pong_cpus)
            os.close(a_w)
            os.close(b_r)
            for _ in range(rounds):
                os.write(b_w, os.read(a_r, 1))
        finally:
            os._exit(0)
    _name(PING)
    if ping_cpus:
        os.sched_setaffinity(0, ping_cpus)
    os.close(a_r)
    os.close(b_w)
    t0 = time.perf_counter()
    for _ in range(rounds):
        os.write(a_w, b"x")
        if not os.read(b_r, 1):
            raise RuntimeError("pong process exited early")
    elapsed = time.perf_counter() - t0
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"pong process failed with status {status}")
    return {
        "ping": os.getpid(),
        "pong": pid,
        "rounds": rounds,
        "pin": pin,
        "elapsed_s": round(elapsed, 6),
    }


PINS = ("none", "same", "split")
C_SOURCE = Path(__file__).with_name("pingpong.c")
C_FLAGS = ("-O2", "-fno-omit-frame-pointer")


def build_c(dest: str) -> list[str]:
    """Build the C ping-pong into the directory `dest`; the command that runs it (append
    ROUNDS and --pin P). RuntimeError when there is no C compiler or the build fails."""
    if not C_SOURCE.is_file():  # not packaged: an installed node compiles nothing
        raise RuntimeError(f"the C ping-pong needs its source, {C_SOURCE.name}, from a checkout")
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise RuntimeError("the C ping-pong needs a C compiler (Debian package build-essential)")
    out = os.path.join(dest, "xh-pingpong")
    res = subprocess.run([cc, *C_FLAGS, "-o", out, str(C_SOURCE)], capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"building {C_SOURCE} failed: {res.stderr.strip()[-400:]}")
    return [out]


def main(argv: list[str]) -> int:
    pin = "none"
    if len(argv) == 3 and argv[1] == "--pin" and argv[2] in PINS:
        pin = argv[2]
    elif len(argv) != 1:
        argv = []
    if not argv or not argv[0].isdigit():
        print(
            "usage: python -m xhagent.trace.workload ROUNDS [--pin none|same|split]",
            file=sys.stderr,
        )
        return 2
    print(json.dumps(ping_pong(int(argv[0]), pin)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
