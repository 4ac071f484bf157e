"""The run queues in one process: ring semantics, slots, steal-half, a hypothesis model, the
ABA interleavings made deterministic with the C's two-step hooks, and sleeping."""

import os
import time
from collections import deque

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from xhagent._runq import ffi, lib
from xhagent.runtime.queues import SharedQueues


@pytest.fixture
def q():
    with SharedQueues.create(workers=3, ring_size=8, slots=32, slot_size=64) as queues:
        yield queues


def drain_local(q, w):
    out = []
    while (item := q.pop_local(w)) is not None:
        out.append(item)
    return out


def test_create_reports_its_parameters_and_others_attach_by_fd_or_path(q, tmp_path):
    assert (q.workers, q.ring_size, q.slots, q.slot_size) == (3, 8, 32, 64)
    assert q.push_global(b"from the creator")
    with SharedQueues.attach(q.fd) as other:
        assert (other.workers, other.slot_size) == (3, 64)
        assert other.pop_global() == b"from the creator"
        assert other.push_local(1, b"back")
    with SharedQueues.attach(q.path) as other:
        assert other.pop_local(1) == b"back"
    with SharedQueues.create(workers=1, path=tmp_path / "rq") as named:
        assert named.path == str(tmp_path / "rq")
        with SharedQueues.attach(tmp_path / "rq") as other:
            assert other.slots == named.slots == 2 * 4096


def test_a_file_that_is_not_a_region_and_bad_parameters_are_refused(tmp_path):
    (tmp_path / "junk").write_bytes(b"x" * 8192)
    with pytest.raises(ValueError, match="not an xhagent run-queue region"):
        SharedQueues.attach(tmp_path / "junk")
    with pytest.raises(ValueError, match="a power of two"):
        SharedQueues.create(workers=2, ring_size=100)
    with pytest.raises(ValueError, match="workers=0"):
        SharedQueues.create(workers=0)


def test_local_ring_is_fifo_bounded_and_empty_gives_none(q):
    assert q.pop_local(0) is None
    assert all(q.push_local(0, b"%d" % i) for i in range(8))
    assert not q.push_local(0, b"one too many")
    assert q.lengths() == ([8, 0, 0], 0)
    assert drain_local(q, 0) == [b"%d" % i for i in range(8)]
    with pytest.raises(IndexError, match="no worker 3"):
        q.pop_local(3)


def test_global_ring_is_fifo_and_bounded(q):
    assert q.pop_global() is None
    assert all(q.push_global(b"g%d" % i) for i in range(8))
    assert not q.push_global(b"full")
    assert [q.pop_global() for _ in range(9)] == [b"g%d" % i for i in range(8)] + [None]


def test_payload_sizes_up_to_a_slot_and_a_larger_one_is_refused_clearly(q):
    assert q.push_local(0, b"") and q.push_global(b"x" * 64)
    assert q.pop_local(0) == b"" and q.pop_global() == b"x" * 64
    with pytest.raises(ValueError, match="65 bytes does not fit a slot of 64"):
        q.push_global(b"x" * 65)
    assert q.free_slots() == 32  # nothing leaked by the refusal


def test_slots_run_out_before_the_rings_and_are_reused():
    with SharedQueues.create(workers=2, ring_size=8, slots=10, slot_size=16) as q:
        assert all(q.push_local(0, b"a%d" % i) for i in range(8))
        assert q.push_global(b"g0") and q.push_global(b"g1")
        assert q.free_slots() == 0
        assert not q.push_global(b"no slot") and not q.push_local(1, b"no slot")
        assert q.pop_local(0) == b"a0"
        assert q.push_local(1, b"reused")
        assert q.pop_local(1) == b"reused"
        drain_local(q, 0)
        assert [q.pop_global(), q.pop_global()] == [b"g0", b"g1"]
        for i in range(1000):  # each slot goes round the free list many times
            assert q.push_global(b"r%d" % i) and q.pop_global() == b"r%d" % i
        assert q.free_slots() == 10


@pytest.mark.parametrize("n, taken", [(0, 0), (1, 1), (2, 1), (5, 3), (8, 4)])
def test_steal_takes_the_older_half_rounded_up_onto_the_thiefs_ring(q, n, taken):
    for i in range(n):
        assert q.push_local(0, b"%d" % i)
    assert q.steal(1, 0) == taken
    assert drain_local(q, 1) == [b"%d" % i for i in range(taken)]
    assert drain_local(q, 0) == [b"%d" % i for i in range(taken, n)]
    with pytest.raises(ValueError, match="cannot steal from itself"):
        q.steal(1, 1)


def test_steal_is_bounded_by_the_thiefs_room(q):
    assert all(q.push_local(0, b"v%d" % i) for i in range(8))
    assert all(q.push_local(1, b"t%d" % i) for i in range(6))
    assert q.steal(1, 0) == 2  # half would be 4: the thief has room for 2
    assert q.lengths() == ([6, 8, 0], 0)
    assert drain_local(q, 1)[-2:] == [b"v0", b"v1"]


def test_wait_with_work_visible_returns_at_once_and_idle_wait_burns_no_cpu(q):
    assert q.push_local(2, b"work")
    assert q.wait(0, 5.0) and q.sleepers() == 0
    q.pop_local(2)
    cpu, wall = time.process_time(), time.monotonic()
    assert not q.wait(0, 0.5)
    cpu, wall = time.process_time() - cpu, time.monotonic() - wall
    assert 0.45 < wall < 1.5 and cpu < 0.02, (wall, cpu)
    assert q.sleepers() == 0


def test_a_wake_is_kept_until_a_wait_answers_it(q):
    q.wake(1)
    start = time.monotonic()
    assert q.wait(1, 5.0) and time.monotonic() - start < 1
    assert not q.wait(1, 0.05)  # answered once


# ---- ABA, deterministically: another party acts between a read and its CAS ----


def test_a_steal_whose_head_went_round_the_ring_to_the_same_cell_and_slot_fails(q):
    """The thief reads head h and copies the cells; the owner then pops each entry and pushes
    a new one, which takes the slot just freed (the free list is LIFO) into the same cell, a
    lap later. So the cells at h.. name the same slot indices as before, only their
    generations differ, and head % ring_size is where it was. A CAS on a head kept modulo
    the ring size (or on the cells' slot indices) would succeed and run those tasks twice."""
    ring = q.ring_size
    for i in range(ring):
        assert q.push_local(0, b"old%d" % i)
    head = ffi.new("uint64_t *")
    n = lib.rq_steal_begin(q._q, 1, 0, head)
    assert n == ring // 2
    before = [lib.rq_local_entry(q._q, 0, head[0] + i) for i in range(n)]
    for i in range(ring):
        assert q.pop_local(0) == b"old%d" % i
        assert q.push_local(0, b"new%d" % i)
    after = [lib.rq_local_entry(q._q, 0, head[0] + ring + i) for i in range(n)]
    assert [e & 0xFFFFFFFF for e in after] == [e & 0xFFFFFFFF for e in before]  # same slots
    assert [e >> 32 for e in after] == [(e >> 32) + 1 for e in before]  # another use
    assert lib.rq_steal_commit(q._q, 1, 0, head[0], n) == 0
    assert q.lengths()[0] == [ring, 0, 0]  # the thief published nothing
    assert drain_local(q, 0) == [b"new%d" % i for i in range(ring)]
    assert q.free_slots() == q.slots


def test_a_free_list_pop_whose_head_slot_was_taken_and_returned_fails(q):
    """Treiber's ABA: the allocator reads head = A with next = B; meanwhile A and B are
    taken and A is freed again, so the head names A once more. Without the tag the CAS would
    install B, which is in use, as the head, and B would be handed out twice."""
    head, nxt = ffi.new("uint64_t *"), ffi.new("uint32_t *")
    a = lib.rq_alloc_begin(q._q, head, nxt)
    ea, eb = lib.rq_slot_alloc(q._q), lib.rq_slot_alloc(q._q)
    assert (ea & 0xFFFFFFFF, eb & 0xFFFFFFFF) == (a, nxt[0])
    lib.rq_slot_free(q._q, ea)
    assert lib.rq_alloc_begin(q._q, ffi.new("uint64_t *"), ffi.new("uint32_t *")) == a
    assert not lib.rq_alloc_commit(q._q, head[0], nxt[0])
    taken = {lib.rq_slot_alloc(q._q) & 0xFFFFFFFF for _ in range(q.slots - 1)}
    assert len(taken) == q.slots - 1 and (eb & 0xFFFFFFFF) not in taken
    assert lib.rq_slot_alloc(q._q) == lib.RQ_NIL


def test_freeing_a_stale_entry_is_ignored(q):
    e = lib.rq_slot_alloc(q._q)
    lib.rq_slot_free(q._q, e)
    lib.rq_slot_free(q._q, e)  # the generation moved on: not pushed a second time
    assert q.free_slots() == q.slots


# ---- a random sequence of operations against a model ----


class QueuesModel(RuleBasedStateMachine):
    WORKERS, RING, SLOTS = 3, 8, 20

    def __init__(self):
        super().__init__()
        self.q = SharedQueues.create(self.WORKERS, self.RING, self.SLOTS, slot_size=32)
        self.local = [deque() for _ in range(self.WORKERS)]
        self.glob = deque()
        self.next = 0

    def in_flight(self):
        return sum(map(len, self.local)) + len(self.glob)

    def item(self):
        self.next += 1
        return b"%d" % self.next

    workers = st.integers(0, WORKERS - 1)

    @rule(w=workers)
    def push_local(self, w):
        item = self.item()
        fits = len(self.local[w]) < self.RING and self.in_flight() < self.SLOTS
        assert self.q.push_local(w, item) == fits
        if fits:
            self.local[w].append(item)

    @rule()
    def push_global(self):
        item = self.item()
        fits = len(self.glob) < self.RING and self.in_flight() < self.SLOTS
        assert self.q.push_global(item) == fits
        if fits:
            self.glob.append(item)

    @rule(w=workers)
    def pop_local(self, w):
        assert self.q.pop_local(w) == (self.local[w].popleft() if self.local[w] else None)

    @rule()
    def pop_global(self):
        assert self.q.pop_global() == (self.glob.popleft() if self.glob else None)

    @rule(thief=workers, victim=workers)
    def steal(self, thief, victim):
        if thief == victim:
            return
        v = self.local[victim]
        n = min(len(v) - len(v) // 2, self.RING - len(self.local[thief]))
        assert self.q.steal(thief, victim) == n
        self.local[thief].extend(v.popleft() for _ in range(n))

    @invariant()
    def lengths_and_slots_agree(self):
        assert self.q.lengths() == ([len(x) for x in self.local], len(self.glob))
        assert self.q.free_slots() == self.SLOTS - self.in_flight()

    def teardown(self):
        self.q.close()


TestQueuesModel = QueuesModel.TestCase
TestQueuesModel.settings = settings(max_examples=150, stateful_step_count=60, deadline=None)


def test_close_twice_and_fd_closed(q):
    fd = q.fd
    q.close()
    q.close()
    with pytest.raises(OSError):
        os.fstat(fd)
