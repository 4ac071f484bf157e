"""Task handles and pool futures keep their fields in the class's shared key table: none of
thousands of them gets a dict of its own (an allocation per task that the collector tracks)."""

import gc

from xhagent.runtime import api as rt
from xhagent.runtime.futures import PoolFuture, complete_all
from xhagent.runtime.scheduler import Scheduler


def _own_dicts(objs) -> int:
    return sum(any(type(r) is dict for r in gc.get_referents(o)) for o in objs)


def _nothing():
    return 1


def _napper():
    rt.sleep(0.0001)
    return 2


def test_thousands_of_finished_tasks_have_no_dict_of_their_own():
    def main():
        handles = [rt.spawn(_nothing) for _ in range(3000)]
        handles += [rt.spawn(_napper) for _ in range(100)]  # parked and woken: more fields
        for h in handles:
            h.join()
        return handles

    handles = Scheduler().run(main)
    assert [h.result() for h in handles[-2:]] == [2, 2]
    assert _own_dicts(handles) == 0


def test_thousands_of_completed_pool_futures_have_no_dict_of_their_own():
    futs = [PoolFuture() for _ in range(3000)]
    complete_all([(f, i % 2 == 0, i if i % 2 == 0 else ValueError(i)) for i, f in enumerate(futs)])
    assert futs[0].result() == 0 and isinstance(futs[1].exception(), ValueError)
    assert _own_dicts(futs) == 0
