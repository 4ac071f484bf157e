"""The agent's metrics from a real store's committed transitions, its exposition checked
with prometheus_client's own parser and the naming conventions, and the exporter over a
real loopback socket. No root needed."""

import errno
import os
import re
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client.exposition import generate_latest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_families
from prometheus_client.parser import text_string_to_metric_families

from xhagent.daemon.metrics import DELAY_KINDS, AgentMetrics
from xhagent.daemon.store import Placement, Store, TaskSummary, WaitReason
from xhagent.daemon.store.states import TaskState
from xhagent.metrics.exporter import Exporter, parse_addr

DOC = "apiVersion: xh.scheduling/v1\nkind: Task\nmetadata: {name: %s}\nspec: {deviceType: cpu}\n"
PLACED = Placement("n1", (0,), exclusive=True)


class Clock:
    def __init__(self):
        self.ns = 1_000_000_000_000

    def __call__(self):
        return self.ns

    def advance(self, seconds):
        self.ns += int(seconds * 1e9)


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def store(tmp_path, clock):
    s = Store.open(tmp_path / "state", clock=clock)
    yield s
    s.close()


@pytest.fixture
def metrics(store):
    m = AgentMetrics(store, lambda: [])
    store.on_commit = m.observe
    return m


def submit(store, name, cls):
    return store.submit(
        name=name,
        kind="cpu",
        source=DOC % name,
        source_file=f"{name}.yaml",
        summary=TaskSummary(document=0, task_class=cls, priority=None, device_type="cpu"),
        idempotency_key=None,
    )


def value(m, name, **labels):
    return m.registry.get_sample_value(name, labels) or 0.0


def test_a_task_life_fills_the_class_histograms_once(store, metrics, clock):
    t = submit(store, "a", "latency")
    clock.advance(0.004)
    store.transition(t.id, TaskState.STARTING, placement=PLACED)
    clock.advance(0.020)
    store.transition(t.id, TaskState.RUNNING)
    clock.advance(3.0)
    store.transition(t.id, TaskState.SUCCEEDED, exit_code=0)
    m = metrics
    assert value(m, "xhagent_task_queue_wait_seconds_count", **{"class": "latency"}) == 1
    assert value(m, "xhagent_task_queue_wait_seconds_sum", **{"class": "latency"}) == 0.004
    assert value(m, "xhagent_task_queue_wait_seconds_bucket", le="0.005", **{"class": "latency"})
    assert value(m, "xhagent_task_start_latency_seconds_sum", **{"class": "latency"}) == 0.02
    assert value(m, "xhagent_task_run_seconds_sum", **{"class": "latency"}) == 3.0
    assert value(m, "xhagent_placement_decisions_total", result="placed") == 1
    assert value(m, "xhagent_tasks", state="Succeeded", **{"class": "latency"}) == 1
    assert value(m, "xhagent_task_run_seconds_count", **{"class": "batch"}) == 0


def test_preemptions_misses_and_pending_reasons_are_counted(store, metrics, clock):
    frozen, killed, waiting = (submit(store, n, "batch") for n in ("f", "k", "w"))
    for t in (frozen, killed):
        store.transition(t.id, TaskState.STARTING, placement=PLACED)
        store.transition(t.id, TaskState.RUNNING)
    store.transition(frozen.id, TaskState.FROZEN)
    reason = WaitReason("Preempted", "n1", "by t9")
    store.transition(killed.id, TaskState.PENDING, reasons=[reason])
    store.transition(waiting.id, TaskState.PENDING, reasons=[WaitReason("Insufficient", "n1")])
    store.add_event("DeadlineMissed", "Running 5 ms past its deadline", task_id=frozen.id)
    m = metrics
    assert value(m, "xhagent_preemptions_total", action="freeze", **{"class": "batch"}) == 1
    assert value(m, "xhagent_preemptions_total", action="kill", **{"class": "batch"}) == 1
    assert value(m, "xhagent_deadline_misses_total", **{"class": "batch"}) == 1
    assert value(m, "xhagent_placement_decisions_total", result="pending") == 1
    assert value(m, "xhagent_pending_tasks", reason="Preempted") == 1
    assert value(m, "xhagent_pending_tasks", reason="Insufficient") == 1
    assert value(m, "xhagent_tasks", state="Frozen", **{"class": "batch"}) == 1


def test_a_migration_is_counted_as_one_and_not_as_a_preemption(store, metrics):
    moved, retried = submit(store, "m", "latency"), submit(store, "r", "batch")
    for t in (moved, retried):
        store.transition(t.id, TaskState.STARTING, placement=PLACED)
        store.transition(t.id, TaskState.RUNNING)
    store.transition(moved.id, TaskState.PENDING, reasons=[WaitReason("Migrating", "n1")])
    store.transition(retried.id, TaskState.PENDING, reasons=[WaitReason("BackOff")])
    store.add_event("Migrated", "moved from n1/gpu0 to n1/gpu1: ...", task_id=moved.id)
    store.add_event("MigrationAborted", "not moved to n1/gpu1: ...", task_id=moved.id)
    m = metrics
    assert value(m, "xhagent_migrations_total", result="moved", **{"class": "latency"}) == 1
    assert value(m, "xhagent_migrations_total", result="aborted", **{"class": "latency"}) == 1
    assert value(m, "xhagent_migrations_total", result="failed", **{"class": "latency"}) == 0
    for cls in ("latency", "batch"):
        assert value(m, "xhagent_preemptions_total", action="kill", **{"class": cls}) == 0


def test_a_rolled_back_change_is_not_counted(store, metrics):
    t = submit(store, "r", "batch")
    with pytest.raises(RuntimeError), store.atomic():
        store.transition(t.id, TaskState.STARTING, placement=PLACED)
        raise RuntimeError("the start failed before the commit")
    assert value(metrics, "xhagent_placement_decisions_total", result="placed") == 0
    assert store.get(t.id).state is TaskState.PENDING


def test_a_failing_observer_does_not_undo_the_commit(store):
    def broken(_written):
        raise ValueError("observer bug")

    store.on_commit = broken
    t = submit(store, "o", "batch")
    store.transition(t.id, TaskState.STARTING, placement=PLACED)
    assert store.get(t.id).state is TaskState.STARTING


UNIT_WORDS = re.compile(r"(latency|wait|duration|time|delay|stall|usage)", re.IGNORECASE)


def lint(text: str) -> list[str]:
    """The Prometheus naming conventions, over what the parser understood of `text`."""
    problems = []
    for fam in text_string_to_metric_families(text):
        name = fam.name
        if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
            problems.append(f"{name}: not snake_case")
        if not fam.documentation.strip():
            problems.append(f"{name}: no HELP")
        # process_ and grpc_server_: the names the ecosystem's dashboards already query
        if not name.startswith(("xhagent_", "process_", "grpc_server_")):
            problems.append(f"{name}: no xhagent_ prefix")
        if UNIT_WORDS.search(name) and not name.endswith(("_seconds", "_bytes")):
            problems.append(f"{name}: a duration without a base unit")
        if name.endswith(("_ms", "_us", "_milliseconds", "_kb", "_mb")):
            problems.append(f"{name}: not a base unit")
        for sample in fam.samples:
            if fam.type == "counter" and not sample.name.endswith(("_total", "_created")):
                problems.append(f"{sample.name}: a counter sample without _total")
    return problems


def test_the_exposition_parses_and_follows_the_naming_conventions(store, metrics, clock):
    t = submit(store, "x", "latency")
    store.transition(t.id, TaskState.STARTING, placement=PLACED)
    store.transition(t.id, TaskState.RUNNING)
    text = generate_latest(metrics.registry).decode()
    assert lint(text) == []
    names = {f.name for f in text_string_to_metric_families(text)}
    assert {"xhagent_tasks", "xhagent_task_start_latency_seconds", "process_cpu_seconds"} <= names
    # the checker itself: what it must refuse
    bad = "# HELP fooLatency x\n# TYPE fooLatency gauge\nfooLatency 1\n"
    assert len(lint(bad)) == 3


def test_parse_addr_says_what_is_wrong():
    assert parse_addr("127.0.0.1:9464") == ("127.0.0.1", 9464)
    assert parse_addr("[::1]:0") == ("::1", 0)
    for bad, why in [
        ("9464", "HOST:PORT"),
        ("example.com:80", "IP address"),
        ("127.0.0.1:http", "port"),
        ("127.0.0.1:70000", "port"),
    ]:
        with pytest.raises(ValueError, match=why):
            parse_addr(bad)


def test_the_exporter_serves_text_and_openmetrics_and_nothing_else(store, metrics):
    exporter = Exporter(metrics.registry, ("127.0.0.1", 0))
    exporter.start()
    try:
        with urllib.request.urlopen(exporter.url, timeout=10) as r:
            assert r.headers["Content-Type"].startswith("text/plain")
            assert "xhagent_tasks" in r.read().decode()
        req = urllib.request.Request(
            exporter.url, headers={"Accept": "application/openmetrics-text; version=1.0.0"}
        )
        with urllib.request.urlopen(req, timeout=10) as r:
            body = r.read().decode()
        assert body.endswith("# EOF\n")
        assert any(f.name == "xhagent_tasks" for f in om_families(body))
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(exporter.url.replace("/metrics", "/other"), timeout=10)
        assert err.value.code == 404
    finally:
        exporter.stop()
    with pytest.raises(OSError):
        urllib.request.urlopen(exporter.url, timeout=2)  # closed: nothing answers there


def test_a_port_in_use_is_a_clear_error(store, metrics):
    first = Exporter(metrics.registry, ("127.0.0.1", 0))
    try:
        with pytest.raises(OSError, match=r"metrics on 127\.0\.0\.1:\d+: Address already in use"):
            Exporter(metrics.registry, first.address)
    finally:
        first.stop()


def busy_loop_for_the_profiler(stop):
    while not stop.is_set():
        sum(range(1000))


def test_debug_endpoints_only_when_asked_for(store, metrics):
    import threading

    plain = Exporter(metrics.registry, ("127.0.0.1", 0))
    plain.start()
    try:
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(plain.url.replace("/metrics", "/debug/stacks"), timeout=10)
        assert err.value.code == 404
    finally:
        plain.stop()
    exporter = Exporter(metrics.registry, ("127.0.0.1", 0), debug=True)
    exporter.start()
    base = exporter.url.removesuffix("/metrics")
    stop = threading.Event()
    busy = threading.Thread(target=busy_loop_for_the_profiler, args=(stop,), name="busy-one")
    busy.start()
    try:
        with urllib.request.urlopen(f"{base}/debug/stacks", timeout=10) as r:
            text = r.read().decode()
        assert "thread busy-one" in text and "busy_loop_for_the_profiler" in text
        with urllib.request.urlopen(f"{base}/debug/profile?seconds=0.5", timeout=10) as r:
            lines = r.read().decode().splitlines()
        hot = [ln for ln in lines if "busy_loop_for_the_profiler" in ln]
        assert hot and all(re.fullmatch(r"thread busy-one;.+ \d+", ln) for ln in hot)
        assert sum(int(ln.rsplit(" ", 1)[1]) for ln in hot) >= 10  # sampled, not once
        with urllib.request.urlopen(f"{base}/debug/heap", timeout=10) as r:
            heap = r.read().decode()
        assert "tracemalloc is off" in heap
        # the allocator's totals and the objects by type come without tracemalloc
        blocks = re.search(r"python: (\d+) allocated blocks; malloc: heap (\d+) bytes", heap)
        assert blocks and int(blocks[1]) > 1000 and int(blocks[2]) > 0, heap
        assert re.search(r"by type: .*\bfunction \d+", heap), heap
        assert re.search(r"largest containers: (dict|list|set|frozenset) of \d+", heap), heap
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"{base}/debug/profile?seconds=1000", timeout=10)
        assert err.value.code == 400
    finally:
        stop.set()
        busy.join()
        exporter.stop()


# -- a Pool's collector (runtime.metrics), over real worker processes ------------------------
def square(x):
    return x * x


def spin(seconds):
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        pass
    return seconds


def samples(registry) -> dict:
    """{(sample name, sorted label items): value} of one exposition, parsed back."""
    text = generate_latest(registry).decode()
    assert lint(text) == []
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def test_a_pools_collector_reports_its_workers_tasks_contexts_steals_and_preemptions():
    from prometheus_client import CollectorRegistry

    from xhagent.runtime.metrics import PoolCollector
    from xhagent.runtime.pool import Pool

    cpus = sorted(os.sched_getaffinity(0))[:2]
    registry = CollectorRegistry()
    with Pool(cpus, slice_ms=10, preempt="timer") as pool:
        registry.register(PoolCollector(pool))
        assert pool.map(square, range(50)) == [x * x for x in range(50)]
        # 200 short CPU-bound tasks queued on one worker's own ring: more than one batch
        # (at most 64 taken at once), so the rest waits there for ~0.3 s, long enough for
        # the other worker to steal; the CPU-clock timer signals each worker meanwhile
        hogs = pool.fan_out(spin, [0.005] * 200)
        assert [f.result(60) for f in hogs] == [0.005] * 200
        deadline = time.monotonic() + 10
        while True:  # the workers' last reports come with their next flush
            got = samples(registry)
            done = sum(v for (n, _), v in got.items() if n == "xhagent_pool_tasks_total")
            signals = sum(
                v for (n, _), v in got.items() if n == "xhagent_pool_preempt_signals_total"
            )
            if done >= 50 + 200 + 1 and signals > 0 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert done >= 50 + 200 + 1  # + the fan_out task that queued the hogs
        assert signals > 0
        assert got[("xhagent_pool_workers", (("state", "alive"),))] == len(cpus)
        assert got[("xhagent_pool_global_tasks_queued", ())] == 0
        for w in pool.workers:
            key = (("cpu", str(w.cpu)), ("worker", str(w.index)))
            states = {
                s: got[
                    (
                        "xhagent_pool_contexts",
                        (("cpu", str(w.cpu)), ("state", s), ("worker", str(w.index))),
                    )
                ]
                for s in ("free", "running", "blocked")
            }
            assert states["blocked"] == 0 and states["free"] >= 1, states
            assert got[("xhagent_pool_contexts_created_total", key)] >= 1
            assert got[("xhagent_pool_tasks_queued", key)] == 0
        if len(cpus) > 1:  # they were queued on one worker's ring: the other stole some
            assert sum(v for (n, _), v in got.items() if n == "xhagent_pool_steals_total") >= 1


def series(m, name):
    families = text_string_to_metric_families(generate_latest(m.registry).decode())
    return [s for f in families for s in f.samples if s.name == name]


def test_every_state_of_every_class_is_a_series_zero_included(store, metrics, tmp_path):
    t = submit(store, "a", "latency")
    store.transition(t.id, TaskState.STARTING, placement=PLACED)
    shown = {
        (s.labels["class"], s.labels["state"]): s.value for s in series(metrics, "xhagent_tasks")
    }
    assert {cls for cls, _ in shown} == {"latency"}
    assert {state for _, state in shown} == {s.value for s in TaskState}
    assert shown[("latency", "Starting")] == 1 and shown[("latency", "Succeeded")] == 0

    with Store.open(tmp_path / "empty") as empty:  # no task at all: every state, at 0
        none = {
            s.labels["state"]: s.value
            for s in series(AgentMetrics(empty, lambda: []), "xhagent_tasks")
        }
    assert set(none) == {s.value for s in TaskState} and set(none.values()) == {0}


def test_build_info_names_the_version_the_interpreter_and_the_kernel(metrics):
    import platform

    from xhagent import __version__

    (info,) = series(metrics, "xhagent_build_info")
    assert info.value == 1
    assert info.labels == {
        "version": __version__,
        "python": platform.python_version(),
        "kernel": os.uname().release,
    }


def test_task_series_are_capped_oldest_first_and_the_rest_counted(store, tmp_path):
    from xhagent.cgroups import Cgroup

    def group(name):
        path = tmp_path / "tree" / name
        path.mkdir(parents=True)
        (path / "cpu.stat").write_text("usage_usec 2000000\nuser_usec 1\nsystem_usec 1\n")
        return name, Cgroup(path)

    own = [group("subtree"), group("shims")]
    leaves = [group(f"tasks/t{i:07d}") for i in (5, 1, 3, 2, 4)]
    m = AgentMetrics(store, lambda: own + leaves, task_series=3)
    cpu = {s.labels["group"] for s in series(m, "xhagent_cgroup_cpu_usage_seconds_total")}
    assert cpu == {"subtree", "shims", "tasks/t0000001", "tasks/t0000002", "tasks/t0000003"}
    assert series(m, "xhagent_metrics_tasks_left_out")[0].value == 2
    m.census.close()


def test_cpu_by_class_holds_ended_and_running_attempts_and_never_goes_back(store, tmp_path):
    from xhagent.cgroups import Cgroup

    tree: list = []

    def leaf(task_id, usec):
        path = tmp_path / "tree" / task_id
        path.mkdir(parents=True, exist_ok=True)
        (path / "cpu.stat").write_text(f"usage_usec {usec}\nuser_usec 1\nsystem_usec 1\n")
        return f"tasks/{task_id}", Cgroup(path)

    m = AgentMetrics(store, lambda: list(tree), task_series=1)  # one leaf shown, the rest read
    store.on_commit = m.observe
    a, b, c = submit(store, "a", "latency"), submit(store, "b", "latency"), submit(store, "c", "")
    for t in (a, b, c):
        store.transition(t.id, TaskState.STARTING, placement=PLACED)
        store.transition(t.id, TaskState.RUNNING)
    tree[:] = [leaf(a.id, 2_000_000), leaf(b.id, 1_000_000), leaf(c.id, 500_000)]
    seen = []

    def cpu():
        got = {s.labels["class"]: s.value for s in series(m, "xhagent_task_cpu_seconds_total")}
        seen.append(got)
        return got

    assert cpu() == {"latency": 3.0, "default": 0.5}
    tree[0] = leaf(a.id, 2_500_000)
    assert cpu()["latency"] == 3.5
    # a ends: its record's figure (read at its leaf's removal) replaces the last reading
    store.transition(a.id, TaskState.SUCCEEDED, exit_code=0, cpu_usec=2_600_000)
    assert cpu()["latency"] == 3.6  # the scrape still lists its leaf: that reading is dropped
    del tree[0]
    # b's leaf could not be read at its end: its last reading stands
    store.transition(b.id, TaskState.FAILED, exit_code=1, cpu_usec=None)
    del tree[0]
    assert cpu()["latency"] == 3.6
    assert store.get(a.id).cpu_usec == 2_600_000 and store.get(b.id).cpu_usec is None
    # c is requeued, runs again in a fresh leaf: both attempts count
    store.transition(c.id, TaskState.PENDING, cpu_usec=700_000, reasons=[WaitReason("Preempted")])
    tree[:] = []
    assert cpu()["default"] == 0.7
    store.transition(c.id, TaskState.STARTING, placement=PLACED)
    assert store.get(c.id).cpu_usec is None  # a new attempt: the last one's figure is gone
    store.transition(c.id, TaskState.RUNNING)
    tree[:] = [leaf(c.id, 100_000)]
    assert cpu()["default"] == pytest.approx(0.8)
    for before, after in zip(seen, seen[1:], strict=False):
        assert all(after[k] >= v for k, v in before.items()), (before, after)
    m.census.close()


class FakeRunq:
    """The run-queue probe's interface (bpf/runqlat.py) over a dict: what it counted for
    each watched group is set by the test; its map holds `room` groups."""

    def __init__(self, room: int = 1024):
        self.room = room
        self.counted: dict[int, object] = {}  # cgroup id -> Histogram
        self._watched: set[int] = set()

    def watch(self, cgid: int) -> int:
        from xhagent.bpf import BpfError

        if len(self._watched) >= self.room:
            raise BpfError(errno.E2BIG, f"cannot watch cgroup {cgid}: the map is full")
        self._watched.add(cgid)
        return cgid

    def unwatch(self, cgid: int) -> None:
        self._watched.discard(cgid)
        self.counted.pop(cgid, None)  # the probe drops its counts with the group

    def watched(self) -> set[int]:
        return set(self._watched)

    def histogram(self, cgid: int):
        from xhagent.bpf.runqlat import RUNQ_SLOTS, Histogram

        if cgid not in self._watched:
            return None
        return self.counted.get(cgid) or Histogram.from_slots([0] * RUNQ_SLOTS, 0)

    def histograms(self) -> dict:
        return {cgid: self.histogram(cgid) for cgid in sorted(self._watched)}


def waits(n: int, each_us: int = 3):
    """A probe reading of `n` waits of `each_us` microseconds (slot 1: [2, 4) us)."""
    from xhagent.bpf.runqlat import RUNQ_SLOTS, Histogram

    return Histogram.from_slots([0, n] + [0] * (RUNQ_SLOTS - 2), n * each_us * 1000)


def by_label(m, name: str, label: str) -> dict[str, float]:
    return {s.labels[label]: s.value for s in series(m, name)}


def test_class_runq_and_memory_hold_every_leaf_past_the_cap_and_never_go_back(store, tmp_path):
    from types import SimpleNamespace

    from xhagent.cgroups import Cgroup

    def group(name, memory=0):
        path = tmp_path / "tree" / name
        path.mkdir(parents=True, exist_ok=True)
        (path / "cpu.stat").write_text("usage_usec 1\nuser_usec 1\nsystem_usec 1\n")
        (path / "memory.current").write_text(f"{memory}\n")
        (path / "cgroup.procs").write_text(f"{os.getpid()}\n")
        return name, Cgroup(path)

    a, b = submit(store, "a", "latency"), submit(store, "b", "latency")
    for t in (a, b):  # running before the metrics existed: recovered at the agent's start
        store.transition(t.id, TaskState.STARTING, placement=PLACED)
        store.transition(t.id, TaskState.RUNNING)
    waited = SimpleNamespace(**{**dict.fromkeys(DELAY_KINDS), "cpu": SimpleNamespace(total=0.25)})
    taskstats = SimpleNamespace(delays_of=lambda pids: dict.fromkeys(pids, waited))
    runq, said = FakeRunq(), []
    m = AgentMetrics(
        store,
        lambda: list(tree),
        runq,
        taskstats,
        task_series=1,
        report=lambda kind, message: said.append((kind, message)),
    )
    store.on_commit = m.observe
    c = submit(store, "c", "")
    store.transition(c.id, TaskState.STARTING, placement=PLACED)
    store.transition(c.id, TaskState.RUNNING)
    own = [group("subtree", 5000), group("shims", 100)]
    leaf = {t.id: group(f"tasks/{t.id}", mem) for t, mem in ((a, 10), (b, 20), (c, 40))}
    tree = [*own, *leaf.values()]
    ids = {name: os.stat(g.path).st_ino for name, g in tree}
    series(m, "xhagent_tasks")  # the first scrape watches every group with processes: a, b, c
    for name, n in (("subtree", 9), ("shims", 5), (f"tasks/{a.id}", 1)):
        runq.counted[ids[name]] = waits(n)
    runq.counted[ids[f"tasks/{b.id}"]] = waits(2)
    runq.counted[ids[f"tasks/{c.id}"]] = waits(4)
    seen = []

    def scrape():
        got = by_label(m, "xhagent_class_runq_latency_seconds_count", "class")
        seen.append(got)
        return got

    assert scrape() == {"latency": 3, "default": 4}
    # the per-group series: the shown groups only (a is the oldest), and no class label
    shown = series(m, "xhagent_runq_latency_seconds_count")
    assert {s.labels["group"]: s.value for s in shown} == {"shims": 5, f"tasks/{a.id}": 1}
    assert ids["subtree"] not in runq.watched()  # (its own group holds no process)
    assert all(set(s.labels) == {"group"} for s in shown)
    sums = by_label(m, "xhagent_class_runq_latency_seconds_sum", "class")
    assert sums == pytest.approx({"latency": 9e-6, "default": 12e-6})
    memory = by_label(m, "xhagent_class_memory_bytes", "class")
    assert memory == {"latency": 30, "default": 40}
    delays = series(m, "xhagent_task_delay_seconds")
    assert {s.labels["group"] for s in delays} == {f"tasks/{a.id}"}
    assert all(s.labels["class"] == "latency" for s in delays)
    # b waits more, then ends and its leaf goes: the probe's last counts for it are kept
    runq.counted[ids[f"tasks/{b.id}"]] = waits(5)
    store.transition(b.id, TaskState.SUCCEEDED, exit_code=0)
    tree.remove(leaf[b.id])
    assert scrape()["latency"] == 6
    assert ids[f"tasks/{b.id}"] not in runq.watched()
    assert by_label(m, "xhagent_class_memory_bytes", "class") == {"latency": 10, "default": 40}
    # c is requeued, its next attempt in a fresh leaf: the old leaf's waits stay counted
    runq.counted[ids[f"tasks/{c.id}"]] = waits(7)
    store.transition(c.id, TaskState.PENDING, reasons=[WaitReason("Preempted")])
    tree.remove(leaf[c.id])
    assert scrape()["default"] == 7
    store.transition(c.id, TaskState.STARTING, placement=PLACED)
    store.transition(c.id, TaskState.RUNNING)
    (tmp_path / "tree" / "tasks" / c.id).rename(tmp_path / "tree" / "attempt-1")
    tree.append(group(f"tasks/{c.id}", 40))
    assert scrape()["default"] == 7  # watched from this scrape on, from zero
    runq.counted[os.stat(tree[-1][1].path).st_ino] = waits(1)
    assert scrape() == {"latency": 6, "default": 8}
    for before, after in zip(seen, seen[1:], strict=False):
        assert all(after[k] >= v for k, v in before.items()), (before, after)
    assert said == []
    m.census.close()


def test_a_full_probe_map_is_said_once_and_the_groups_shown_are_watched_first(store, tmp_path):
    from xhagent.cgroups import Cgroup

    def group(name):
        path = tmp_path / "tree" / name
        path.mkdir(parents=True)
        return name, Cgroup(path)

    tasks = [submit(store, n, "batch") for n in "abc"]
    for t in tasks:
        store.transition(t.id, TaskState.STARTING, placement=PLACED)
        store.transition(t.id, TaskState.RUNNING)
    tree = [group("subtree"), group("shims"), *(group(f"tasks/{t.id}") for t in tasks)]
    runq, said = FakeRunq(room=2), []
    m = AgentMetrics(
        store,
        lambda: tree,
        runq,
        task_series=1,
        report=lambda kind, message: said.append((kind, message)),
    )
    for _ in range(2):
        counts = by_label(m, "xhagent_runq_latency_seconds_count", "group")
        assert set(counts) == {"shims", f"tasks/{tasks[0].id}"}
        assert "batch" in by_label(m, "xhagent_class_runq_latency_seconds_count", "class")
    (kind, message), *more = said
    assert kind == "NotObserved" and more == []
    assert "2 groups" in message and "the map is full" in message
    runq.room = 5  # room again: all watched, and a later full map is said again
    series(m, "xhagent_tasks")
    assert len(runq.watched()) == 4  # shims and the three leaves
    runq.room, tree = 0, [*tree, group("tasks/t9999999")]
    series(m, "xhagent_tasks")
    assert len(said) == 2
    m.census.close()
