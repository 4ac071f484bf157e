"""DWPS on the node without root or a GPU: the loop's fakes (test_daemon_loop.py) on a node
model with one 16 GiB GPU, and pynvml's stand-in for what each process uses.

Asserted: under dwps a GPU share is placed only in one free block of the GPU's line, and a
request that finds the bytes but no block evicts the task the simulator's `Dwps` chooses
(the best fit, of the later deadlines) and starts in the block it leaves; without dwps the
same request starts at once, as before; a task that may not be preempted is never chosen;
NVML's per-process use grows a task's place on the line; and the daemon decides through
the simulator's own function.
"""

from __future__ import annotations

import pytest
from test_daemon_loop import Clock, Loop, node, task

from xhagent.daemon.policies.sources import parse_source
from xhagent.daemon.store import TaskState
from xhagent.sched import dwps

GIB = 1 << 30
NAMES = "abcdefgh"


def queueing(algorithm: str, preemption: str = "queueing") -> object:
    text = (
        "apiVersion: xh.scheduling/v1\nkind: SchedulingPolicy\nmetadata: {name: q}\n"
        f"spec:\n  preemption: {preemption}\n  queueing: {{algorithm: {algorithm}}}\n"
        "  matchRules:\n    - selector: {matchLabels: {app: x}}\n"
    )
    return parse_source(text, "q.yaml")[0].value


def gpu_task(name: str, memory: str, deadline: str, extra: str = "") -> str:
    spec = (
        f"  requests: {{cpus: 1, gpus: 1, gpuMemory: {memory}}}\n  deadline: {deadline}\n" + extra
    )
    return task(name, spec).replace("  deviceType: cpu\n", "  deviceType: gpu\n", 1)


@pytest.fixture
def loop(tmp_path):
    made = Loop(tmp_path, node(cpus=16, gpus=1), Clock())
    yield made
    made.close()


def scattered(loop, algorithm: str, extra: dict | None = None) -> dict[str, str]:
    """Eight 2 GiB tasks fill the GPU in order (a at 0, ..., h at 14 GiB); a, c and e end:
    6 GiB free in three 2 GiB blocks."""
    loop.policies = [queueing(algorithm)]
    extra = extra or {}
    submitted = loop.submit(*(gpu_task(n, "2GiB", "1h", extra.get(n, "")) for n in NAMES))
    ids = dict(zip(NAMES, submitted, strict=True))
    loop.step()
    assert all(loop.state(i) == TaskState.RUNNING for i in ids.values())
    for n in "ace":
        loop.executor.exit(ids[n], 0)
    loop.step()
    return ids


def line(loop) -> list[tuple[str, int, int]]:
    """GPU 0's line: (task id, start GiB, size GiB) in address order."""
    memory = loop.scheduler.gpu_memory.lines[0].memory
    return [(a.owner, a.start // GIB, a.size // GIB) for a in memory.allocations]


def test_a_request_that_finds_no_block_evicts_the_best_fit_of_the_later_deadlines(loop):
    ids = scattered(loop, "dwps")
    b, d, f, g, h = (ids[n] for n in "bdfgh")
    assert line(loop) == [(b, 2, 2), (d, 6, 2), (f, 10, 2), (g, 12, 2), (h, 14, 2)]
    (urgent,) = loop.submit(gpu_task("urgent", "4GiB", "1m"))
    loop.step()
    # f's leaving makes e's block and its own one of 4 GiB: fit 1.0, the best
    assert loop.state(f) == TaskState.PENDING
    assert loop.executor.runs[f].exit.signal == 9  # killed: a freeze would keep its memory
    rec = loop.store.get(urgent)
    assert rec.state == TaskState.RUNNING and rec.placement.gpu_uuids == ["GPU-0"]
    assert (urgent, 8, 4) in line(loop)
    (evicted,) = loop.events("GpuCompacted", urgent)
    assert evicted.detail["evicted"] == f and evicted.detail["gpu"] == 0
    assert evicted.detail["fragmentation"] == pytest.approx(1 - 2 / 6, abs=1e-4)
    assert evicted.detail["threshold"] == 0.65
    pending = [e for e in loop.store.events(0, task_id=f) if e.kind == "Transition"][-1]
    assert pending.message == (
        f"Running -> Pending: GPU 0 memory fragmented (0.67 over 0.65): preempted by {urgent}"
    )
    assert all(loop.state(i) == TaskState.RUNNING for i in (b, d, g, h))
    counted = loop.metrics.registry.get_sample_value(
        "xhagent_gpu_compactions_total", {"class": "default"}
    )
    assert counted == 1


def test_without_dwps_the_same_request_starts_in_the_free_bytes(loop):
    ids = scattered(loop, "edf")
    (urgent,) = loop.submit(gpu_task("urgent", "4GiB", "1m"))
    loop.step()
    assert loop.state(urgent) == TaskState.RUNNING
    assert all(loop.state(ids[n]) == TaskState.RUNNING for n in "bdfgh")
    assert loop.events("GpuCompacted") == [] and loop.scheduler.gpu_memory.lines == {}


def test_an_earlier_deadline_or_a_task_that_says_never_is_not_evicted(loop):
    ids = scattered(loop, "dwps", {"f": "  preemption: never\n"})
    (late,) = loop.submit(gpu_task("late", "4GiB", "2h"))  # due after all of them
    loop.step()
    rec = loop.store.get(late)
    assert rec.state == TaskState.PENDING
    (reason,) = rec.reasons
    assert reason.kind == "GpuMemoryFragmented"
    assert reason.detail == (
        "GpuMemoryFragmented: n1 GPU 0 has 6 GiB free, its largest free block 2 GiB, "
        "task needs 4 GiB in one block"
    )
    (urgent,) = loop.submit(gpu_task("urgent", "4GiB", "1m"))
    loop.step()
    # f may not be preempted; b and d each open 6 GiB (fit 0.67), and the tie goes to the
    # first by name, as in the simulator
    assert loop.state(ids["f"]) == TaskState.RUNNING
    assert loop.state(ids["b"]) == TaskState.PENDING and loop.state(ids["d"]) == TaskState.RUNNING
    assert loop.state(urgent) == TaskState.RUNNING and loop.state(late) == TaskState.PENDING
    (evicted,) = loop.events("GpuCompacted", urgent)
    # late's try found no task due after it: a failed compaction, the threshold lowered
    assert evicted.detail["evicted"] == ids["b"] and evicted.detail["threshold"] == 0.63


def test_nvml_use_past_a_reservation_grows_the_task_on_the_line(loop, standin_nvml):
    stand_in, nvml = standin_nvml
    model = loop.scheduler.gpu_memory
    model.nvml = nvml
    loop.policies = [queueing("dwps")]
    one, two = loop.submit(gpu_task("one", "2GiB", "1h"), gpu_task("two", "2GiB", "1h"))
    loop.step()
    assert line(loop) == [(one, 0, 2), (two, 2, 2)]
    # one's two processes use 5 GiB in all; a process of no task's counts for none, and one
    # whose use NVML cannot tell (None) for nothing
    loop.executor.pids = {101: one, 102: one}
    stand_in.processes = [(101, 3 * GIB), (102, 2 * GIB), (999, 8 * GIB), (103, None)]
    model.sample()
    loop.step()
    assert line(loop) == [(two, 2, 2), (one, 4, 5)]  # moved: two's bytes follow its own
    assert loop.scheduler.lifecycle.cluster.nodes["n1"].gpu(0).largest_block == 7 * GIB


def test_the_node_decides_through_the_simulators_dwps(loop, monkeypatch):
    calls = []
    real = dwps.Dwps.compact

    def spy(self, gpu, need, movable):
        done = real(self, gpu, need, movable)
        calls.append((need, done.victim.owner if done and done.victim else None))
        return done

    monkeypatch.setattr(dwps.Dwps, "compact", spy)
    ids = scattered(loop, "dwps")
    (urgent,) = loop.submit(gpu_task("urgent", "4GiB", "1m"))
    loop.step()
    assert calls == [(4 * GIB, ids["f"])]


def test_a_policy_change_away_from_dwps_drops_the_lines_and_their_blocks(loop):
    ids = scattered(loop, "dwps")
    gpu = loop.scheduler.lifecycle.cluster.nodes["n1"].gpu(0)
    assert gpu.largest_block == 2 * GIB and loop.scheduler.gpu_memory.lines
    loop.policies = [queueing("edf")]
    loop.step()
    assert gpu.largest_block is None and loop.scheduler.gpu_memory.lines == {}
    (wide,) = loop.submit(gpu_task("wide", "4GiB", "1m"))  # 6 GiB free: it fits by bytes
    loop.step()
    assert loop.state(wide) == TaskState.RUNNING
    assert all(loop.state(ids[n]) == TaskState.RUNNING for n in "bdfgh")


def test_after_a_restart_the_lines_are_laid_out_again_from_what_runs(loop):
    ids = scattered(loop, "dwps")
    loop.restart()  # kill -9 and a new agent on the same state: the lines were its memory
    loop.step()
    held = [ids[n] for n in "bdfgh"]
    assert all(loop.state(i) == TaskState.RUNNING for i in held)
    # first fit in the order recovery holds them: packed, the holes of the old agent gone
    assert sorted(line(loop), key=lambda a: a[1]) == [(i, 2 * k, 2) for k, i in enumerate(held)]


def test_a_request_whose_policy_says_never_evicts_nothing(loop):
    ids = scattered(loop, "dwps")
    loop.policies = [queueing("dwps", preemption="never")]
    (urgent,) = loop.submit(gpu_task("urgent", "4GiB", "1m"))
    loop.step()
    assert loop.state(urgent) == TaskState.PENDING
    assert loop.store.get(urgent).reasons[0].kind == "GpuMemoryFragmented"
    assert all(loop.state(ids[n]) == TaskState.RUNNING for n in "bdfgh")
    assert loop.events("GpuCompacted") == []
