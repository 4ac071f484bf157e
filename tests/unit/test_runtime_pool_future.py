"""PoolFuture: a Future with its Condition made on first use, completed without a lock
only while nobody can be waiting on it."""

import concurrent.futures
import pickle
import threading

import pytest

from xhagent.runtime.futures import PoolFuture, complete, complete_all


def test_completed_untouched_then_read_like_a_future():
    ok, bad = PoolFuture(), PoolFuture()
    complete_all([(ok, True, 42), (bad, False, ValueError("no"))])
    assert ok._cond is None and bad._cond is None  # no lock was ever made
    assert ok.done() and ok.result(0) == 42 and ok.exception(0) is None
    with pytest.raises(ValueError, match="no"):
        bad.result(0)
    assert not ok.cancel()


def test_a_thread_waiting_before_completion_is_woken():
    fut = PoolFuture()
    got = []
    waiter = threading.Thread(target=lambda: got.append(fut.result(10)))
    waiter.start()
    while fut._cond is None:  # the waiter has made the Condition and may be waiting in it
        threading.Event().wait(0.001)
    complete(fut, True, "late")
    waiter.join(10)
    assert got == ["late"]


def test_cancelled_first_stays_cancelled_and_callbacks_run():
    fut = PoolFuture()
    seen = []
    fut.add_done_callback(lambda f: seen.append(f.cancelled()))
    assert fut.cancel()
    complete_all([(fut, True, 1)])  # the worker ran it anyway: the result is dropped
    assert fut.cancelled() and seen == [True]


def test_wait_and_as_completed_accept_it():
    futs = [PoolFuture() for _ in range(3)]
    threading.Timer(0.01, complete_all, [[(f, True, i) for i, f in enumerate(futs)]]).start()
    done, _ = concurrent.futures.wait(futs, timeout=10)
    assert done == set(futs)
    assert sorted(f.result() for f in concurrent.futures.as_completed(futs, 10)) == [0, 1, 2]


def test_outcomes_are_sent_in_batches_within_a_slot():
    from xhagent.runtime.worker import encode_results

    ok = [(i, True, i * i) for i in range(100)]
    [one] = encode_results(ok, 4096)
    assert pickle.loads(one) == ("done", ok)
    many = encode_results([(i, True, bytes([i]) * 300) for i in range(40)], 4096)
    assert len(many) > 1 and all(len(m) <= 4096 for m in many)
    assert [t for m in many for t, _, _ in pickle.loads(m)[1]] == list(range(40))
    bad = encode_results([(1, True, 2), (2, True, lambda: 0), (3, True, b"y" * 5000)], 4096)
    got = {t: (ok, v) for m in bad for t, ok, v in pickle.loads(m)[1]}
    assert got[1] == (True, 2)
    assert not got[2][0] and "cannot be sent back" in str(got[2][1])
    assert not got[3][0] and "over a slot" in str(got[3][1])
