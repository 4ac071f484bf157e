"""A task's payload in the pool's rings: a fixed header (task id, class, deadline, NaN for
none) before the pickled (fn, args, kwargs). The header is read apart from the body, so a
body a worker cannot load (its function's module is not importable there, an argument's
class is missing) fails that task alone, with the reason, instead of killing the worker."""

from __future__ import annotations

import math
import os
import pickle
import struct

HEADER = struct.Struct("<qBd")
STOP = HEADER.pack(-1, 0, math.nan)  # a worker that takes it stops taking work


class TaskLoadError(RuntimeError):
    """The worker could not load the task (its function or arguments did not unpickle)."""


def encode_task(task_id: int, fn, args, kwargs, priority: int, deadline) -> bytes:
    head = HEADER.pack(task_id, priority, math.nan if deadline is None else deadline)
    return head + pickle.dumps((fn, args, kwargs))


def _unloadable(why: str):
    raise TaskLoadError(why)


def decode_task(blob: bytes) -> tuple | None:
    """(task_id, fn, args, kwargs, priority, deadline), or None for STOP; a body that does
    not load becomes a call that raises TaskLoadError naming why."""
    task_id, priority, deadline = HEADER.unpack_from(blob)
    if task_id < 0:
        return None
    try:
        fn, args, kwargs = pickle.loads(memoryview(blob)[HEADER.size :])
    except Exception as exc:  # anything a reduce or __setstate__ may raise
        why = f"task {task_id} could not be loaded in worker pid {os.getpid()}: "
        fn, args, kwargs = _unloadable, (why + f"{type(exc).__name__}: {exc}",), {}
    return task_id, fn, args, kwargs, priority, None if math.isnan(deadline) else deadline
