"""The agent's memory allocator: the C library's malloc for every Python object, so that
memory freed after a peak (thousands of streams, a burst of tasks) goes back to the kernel.

CPython's own small-object allocator (pymalloc) keeps each 1 MiB arena mapped while any
object in it lives. After 2,000 idle streams had closed, the few hundred small objects
allocated while they were open (asyncio's and grpc's own) kept arenas resident: 7-13 MB
that never came back. With PYTHONMALLOC=malloc every object comes from malloc, whose free
pages the agent gives back when it falls idle (heap.trim): 4 MB stayed. It costs about 5%
more of the agent's CPU in a burst of tasks (figures in docs/benchmarks.md).

PYTHONMALLOC is read first thing when the interpreter starts, so `xhagent run` executes
itself again once with it set (the pid stays), marked so that it does not again; after
that exec the variables are taken out of its environment, so no child inherits them (a
workload's environment is built apart anyway). A caller that set PYTHONMALLOC itself is
left as it chose.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field

CHOICES = ("malloc", "pymalloc")
MARK = "XHAGENT_ALLOCATOR"  # set on the exec that chose: this process has its allocator
HELD_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)  # what signals.py handles


@dataclass(frozen=True)
class Choice:
    name: str  # malloc, pymalloc, or "as set" (the caller's own PYTHONMALLOC)
    why: str
    # what to execute again with (None: this process is as it will be)
    env: dict[str, str] | None = field(default=None, compare=False)


def choose(wanted: str, environ: Mapping[str, str]) -> Choice:
    """What `xhagent run --allocator WANTED` runs with."""
    if wanted not in CHOICES:
        raise ValueError(f"--allocator {wanted!r}: one of {', '.join(CHOICES)}")
    if MARK in environ:
        return Choice(environ[MARK], "chosen at start")
    if wanted == "pymalloc":
        return Choice("pymalloc", "--allocator pymalloc: freed memory can stay resident")
    if "PYTHONMALLOC" in environ:
        given = environ["PYTHONMALLOC"]
        return Choice("as set", f"PYTHONMALLOC={given} set by the caller, left as it is")
    return Choice("malloc", "", {"PYTHONMALLOC": "malloc", MARK: "malloc"})


def settle(wanted: str) -> str:
    """Execute again with the chosen allocator (this call then does not return), or return
    what this process runs with, in a few words for the log. ValueError as choose()."""
    choice = choose(wanted, os.environ)
    if choice.env is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        # A stop asked for from here until the new image holds its handlers stays pending
        # (the mask and pending signals survive the exec; signals.py unblocks them), not
        # the default action.
        signal.pthread_sigmask(signal.SIG_BLOCK, HELD_SIGNALS)
        try:
            os.execve(sys.executable, sys.orig_argv, {**os.environ, **choice.env})
        except OSError as exc:  # the agent goes on as it is, and says so
            signal.pthread_sigmask(signal.SIG_UNBLOCK, HELD_SIGNALS)
            why = exc.strerror or str(exc)
            return f"pymalloc (executing {sys.executable or 'the interpreter'} again failed: {why})"
    if MARK not in os.environ:
        return f"{choice.name} ({choice.why})"
    for name in ("PYTHONMALLOC", MARK):
        os.environ.pop(name, None)
    return f"{choice.name} (every object from malloc: freed memory goes back to the kernel)"
