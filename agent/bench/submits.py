"""Driving a scratch agent through its API, for `xhagent bench agent`'s cases: a Task
document, percentiles, Submits from client threads, waiting for tasks' states."""

from __future__ import annotations

import json
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass


def task_doc(name: str, command: list[str], extra: str = "") -> str:
    return (
        f"apiVersion: xh.scheduling/v1\nkind: Task\nmetadata: {{name: {name}}}\n"
        f"spec:\n  deviceType: cpu\n  command: {json.dumps(command)}\n{extra}"
    )


def percentile(values: list[float], q: float) -> float:
    """The value below which a share `q` of `values` lies (nearest rank, never interpolated:
    a p99 is a figure that was measured)."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def spread_us(prefix: str, values_us: list[float]) -> dict:
    """p50 and p99 of `values_us` as `PREFIX_p50_us`, `PREFIX_p99_us`; None when empty."""
    if not values_us:
        return {f"{prefix}_p50_us": None, f"{prefix}_p99_us": None}
    return {
        f"{prefix}_p50_us": round(percentile(values_us, 0.5), 1),
        f"{prefix}_p99_us": round(percentile(values_us, 0.99), 1),
    }


@dataclass(frozen=True)
class Calls:
    latencies_us: list[float]  # of each call
    wall_s: float  # from the first call's start to the last one's reply
    first_ns: int  # wall clock (the agent's clock too) when the first call started
    replies: list  # what each call returned, in no particular order


def calls_from_clients(session, total: int, clients: int) -> Calls:
    """`total` calls from `clients` threads at once, closed loop: each thread opens its own
    channel (`with session() as call`) and makes calls `i = k, k + clients, ...` one after
    the other (`call(i)`), timing each."""
    lat: list[float] = []
    replies: list = []
    lock = threading.Lock()
    failures: list[BaseException] = []

    def worker(k: int) -> None:
        try:
            with session() as call:
                for i in range(k, total, clients):
                    t0 = time.perf_counter_ns()
                    reply = call(i)
                    with lock:
                        lat.append((time.perf_counter_ns() - t0) / 1000)
                        replies.append(reply)
        except Exception as exc:  # raised again in the caller's thread, where it is reported
            failures.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(clients)]
    first_ns, t0 = time.time_ns(), time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures:
        raise failures[0]
    return Calls(lat, time.monotonic() - t0, first_ns, replies)


@dataclass(frozen=True)
class Submitted:
    ids: list[str]  # in no particular order
    latencies_us: list[float]  # of each Submit call
    wall_s: float  # from the first call's start to the last one's reply
    first_ns: int  # wall clock (the agent's clock too) when the first call started


def submit_from_clients(agent, total: int, clients: int, prefix: str) -> Submitted:
    """`total` Submits of one `true` task each, from `clients` threads at once, each thread
    on its own channel."""
    from ..daemon.api.v1 import agent_pb2 as pb

    @contextmanager
    def session():
        with agent.client() as c:

            def submit(i: int) -> str:
                source = task_doc(f"{prefix}{i}", ["true"])
                return c.Submit(pb.SubmitRequest(source=source, file_name="bench.yaml")).tasks[0].id

            yield submit

    sent = calls_from_clients(session, total, clients)
    return Submitted(sent.replies, sent.latencies_us, sent.wall_s, sent.first_ns)


def wait_states(client, ids: list[str], states: set[str], timeout: float) -> None:
    """Until every task of `ids` is in one of `states`: the agent is asked for the tasks
    still elsewhere (a page of at most 1,000; a full page proves nothing, so it asks again)."""
    from ..daemon.api.v1 import agent_pb2 as pb
    from ..daemon.store.states import TERMINAL, TaskState

    # the tasks not yet where they are going; never the ended ones (they pile up)
    others = [s.value for s in TaskState if s.value not in states and s not in TERMINAL]
    deadline = time.monotonic() + timeout
    wanted = set(ids)
    while True:
        tasks = client.List(pb.ListRequest(states=others, limit=1000)).tasks
        left = wanted & {t.id for t in tasks}
        if not left and len(tasks) < 1000:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(left)} tasks not in {sorted(states)} after {timeout}s")
        time.sleep(0.1)
