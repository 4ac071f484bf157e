"""The pool's futures (PoolFuture) and their completion in bulk, for the owner's collector
and a PoolClient's alike."""

from __future__ import annotations

from concurrent.futures import Future, InvalidStateError
from concurrent.futures._base import FINISHED, PENDING

from .task import MAKE_CONDITION, LazyFuture, prime_instance_keys


class PoolFuture(LazyFuture):
    """A future of the pool's: a LazyFuture (its Condition and lists made on first use).

    Completion (`complete_all`, the collector's) holds MAKE_CONDITION: with no Condition
    made, nobody waits, and nobody can start to until the outcome is written; with one,
    it is Future's own set_result under it."""

    _pushed = float("inf")  # a client's: when its push returned (time.monotonic)

    def __init__(self):
        pass  # everything starts as a class default


prime_instance_keys(PoolFuture)  # see there: the collector writes _result on thousands at once


def complete_all(done: list) -> None:
    """Complete (future, ok, value) triples: those nobody touched under one lock hold,
    the rest as Future does it."""
    slow = []
    with MAKE_CONDITION:
        for item in done:
            fut = item[0]
            if fut._cond is None and type(fut) is PoolFuture and fut._state is PENDING:
                if item[1]:
                    fut._result = item[2]
                else:
                    fut._exception = item[2]
                fut._state = FINISHED
            else:
                slow.append(item)
    for fut, ok, value in slow:
        complete(fut, ok, value)


def complete(fut: Future, ok: bool, value) -> None:
    if type(fut) is PoolFuture and fut._cond is None:
        return complete_all([(fut, ok, value)])
    try:
        fut.set_result(value) if ok else fut.set_exception(value)
    except InvalidStateError:
        pass  # cancelled by its caller meanwhile; the worker ran it anyway
