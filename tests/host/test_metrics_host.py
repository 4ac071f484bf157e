"""The agent's metrics scraped by a real Prometheus server (Debian's `prometheus`, from
tools/setup-deps) on loopback, and queried through its HTTP API."""

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from xhagent.bench.local_agent import LocalAgent

pytestmark = pytest.mark.host

XHAGENT = Path(sys.executable).with_name("xhagent")
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


class Prometheus:
    def __init__(self, base: Path, target: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = base / "prometheus.yml"
        config.write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            "scrape_configs:\n"
            "  - job_name: xhagent\n"
            f"    static_configs: [{{targets: ['{target}']}}]\n"
        )
        self.log = base / "prometheus.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [
                    PROMETHEUS,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={base / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self._wait(lambda: urllib.request.urlopen(f"{self.url}/-/ready", timeout=2).status == 200)

    def _wait(self, ready, timeout: float = 60.0):
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                pytest.fail(f"prometheus exited: {self.log.read_text()[-2000:]}")
            try:
                if ready():
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"prometheus not ready in {timeout}s: {self.log.read_text()[-2000:]}")
            time.sleep(0.2)

    def query(self, expr: str) -> list:
        q = urllib.parse.urlencode({"query": expr})
        doc = get_json(f"{self.url}/api/v1/query?{q}")
        assert doc["status"] == "success", doc
        return doc["data"]["result"]

    def scalar(self, expr: str) -> float | None:
        result = self.query(expr)
        return float(result[0]["value"][1]) if result else None

    def wait_scrapes(self, n: int = 2) -> None:
        """Until the target has been scraped `n` more times (its up series has n points)."""
        start = self.scalar("count_over_time(up[5m])") or 0
        self._wait(lambda: (self.scalar("count_over_time(up[5m])") or 0) >= start + n)

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def agent(tmp_path):
    a = LocalAgent(tmp_path, f"xhagent-metrics-test-{os.getpid()}-{tmp_path.name[-12:]}.slice")
    a.start()
    yield a
    a.stop()
    a.remove_subtree()


def submit(agent, tmp_path: Path, name: str, command: list[str]) -> str:
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        "apiVersion: xh.scheduling/v1\nkind: Task\n"
        f"metadata: {{name: {name}}}\n"
        f"spec:\n  deviceType: cpu\n  command: {json.dumps(command)}\n"
    )
    res = subprocess.run(
        [str(XHAGENT), "submit", str(path), "--wait", "--socket", str(agent.socket)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    return res.stdout.split()[0]


def test_a_real_prometheus_scrapes_the_agent_and_sees_counters_rise(agent, tmp_path):
    url = agent.metrics_url()
    assert url.startswith("http://127.0.0.1:") and url.endswith("/metrics")
    target = urllib.parse.urlsplit(url).netloc
    (tmp_path / "prom").mkdir()
    prom = Prometheus(tmp_path / "prom", target)
    try:
        prom.wait_scrapes(2)
        placed = 'sum(xhagent_placement_decisions_total{result="placed"})'
        before = prom.scalar(placed) or 0.0
        for i in range(3):
            submit(agent, tmp_path, f"m{i}", ["sh", "-c", "exit 0"])
        prom.wait_scrapes(2)
        assert prom.scalar(placed) == before + 3  # a counter that rose, as Prometheus saw it
        succeeded = prom.scalar('sum(xhagent_tasks{state="Succeeded"})')
        assert succeeded == 3
        median = prom.scalar(
            "histogram_quantile(0.5, sum by (le) (xhagent_task_start_latency_seconds_bucket))"
        )
        assert median is not None and 0 < median < 60  # a quantile of real starts
        assert prom.scalar('sum(xhagent_cgroup_cpu_usage_seconds_total{group="shims"})') > 0
        assert prom.scalar('xhagent_cgroup_cpu_usage_seconds_total{group="subtree"}') > 0
        # the groups' files were read by the io engine (io_uring, or pread where io_uring
        # would punt), never by the plain fallback here, and the count rises per scrape
        reads = 'sum(xhagent_stats_file_reads_total{via=~"io_uring|pread"})'
        first = prom.scalar(reads)
        assert first is not None and first > 0
        assert prom.scalar('xhagent_stats_file_reads_total{via="plain"}') == 0
        prom.wait_scrapes(1)
        assert prom.scalar(reads) > first
        # the shims' group is always there, and its processes wake and wait for a CPU
        shims = 'xhagent_runq_latency_seconds_bucket{group="shims"}'
        runq = prom.scalar(f"histogram_quantile(0.9, sum by (le) ({shims}))")
        assert runq is not None and 0 < runq < 10, runq
        # the CLI's calls, by method and code, and the loop's steps, as Prometheus read them
        submits = 'grpc_server_handled_total{grpc_method="Submit",grpc_code="OK"}'
        assert prom.scalar(submits) >= 3
        assert prom.scalar("xhagent_scheduler_step_seconds_count") > 0
        info = 'xhagent_build_info{kernel!=""}'
        assert prom.scalar(info) == 1
        targets = get_json(f"{prom.url}/api/v1/targets")["data"]["activeTargets"]
        assert [(t["scrapeUrl"], t["health"]) for t in targets] == [(url, "up")]
    finally:
        prom.stop()


def test_promtool_finds_nothing_to_lint_in_a_scrape(agent, tmp_path):
    promtool = shutil.which("promtool") or "/usr/bin/promtool"  # prometheus's package
    path = tmp_path / "sleep.yaml"
    path.write_text(
        "apiVersion: xh.scheduling/v1\nkind: Task\nmetadata: {name: sleep}\n"
        "spec:\n  deviceType: cpu\n  command: [sleep, '60']\n"
    )
    res = subprocess.run(
        [str(XHAGENT), "submit", str(path), "--socket", str(agent.socket)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    try:
        # The text format: promtool (2.42) parses no other. The OpenMetrics output is parsed
        # by the real Prometheus's scrapes (it asks for it first) and by the client
        # library's strict parser (tests/unit/test_metrics.py).
        for _ in range(2):  # the second scrape has the leaf watched: its histograms filled
            with urllib.request.urlopen(agent.metrics_url(), timeout=10) as r:
                body = r.read()
        assert b'xhagent_class_runq_latency_seconds_count{class="' in body
        lint = subprocess.run(
            [promtool, "check", "metrics"], input=body, capture_output=True, timeout=60
        )
        assert lint.returncode == 0 and not lint.stdout.strip(), lint.stdout + lint.stderr
    finally:
        subprocess.run(
            [str(XHAGENT), "cancel", res.stdout.split()[0], "--socket", str(agent.socket)],
            capture_output=True,
            timeout=60,
        )


def test_bench_metrics_reports_a_scrape_and_leaves_no_group():
    from xhagent.cgroups.mounts import discover_hierarchy

    res = subprocess.run(
        [str(XHAGENT), "bench", "metrics", "--groups", "5", "--tasks", "20", "--rounds", "3"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    scrape = out["cases"]["scrape"]
    # 5 groups' cpu.stat and pressure series at least, and the tasks by state and class
    assert scrape["series"] > 5 * 7 and scrape["p50_ms"] > 0
    assert set(out["targets_met"]) == {"scrape_p99_ms"}
    unified = Path(discover_hierarchy().unified.path)
    assert not list(unified.glob("xhagent-bench-metrics-*"))


def test_each_task_shows_its_delays_and_its_run_queue_latency(agent, tmp_path):
    import urllib.request as request

    from prometheus_client.parser import text_string_to_metric_families

    spin = ["sh", "-c", "while :; do :; done"]
    ids = []
    for i in range(3):  # three spinners on two CPUs: each waits for a CPU now and then
        path = tmp_path / f"spin{i}.yaml"
        path.write_text(
            "apiVersion: xh.scheduling/v1\nkind: Task\n"
            f"metadata: {{name: spin{i}}}\n"
            f"spec:\n  deviceType: cpu\n  command: {json.dumps(spin)}\n"
        )
        res = subprocess.run(
            [str(XHAGENT), "submit", str(path), "--socket", str(agent.socket)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        ids.append(res.stdout.split()[0])
    url = agent.metrics_url()
    try:
        with request.urlopen(url, timeout=10):
            pass  # the first scrape starts watching the leaves
        time.sleep(2)
        with request.urlopen(url, timeout=10) as r:
            fams = {f.name: f for f in text_string_to_metric_families(r.read().decode())}
    finally:
        for tid in ids:
            subprocess.run(
                [str(XHAGENT), "cancel", tid, "--socket", str(agent.socket)],
                capture_output=True,
                timeout=60,
            )
    delays = {
        s.labels["group"]: s.value
        for s in fams["xhagent_task_delay_seconds"].samples
        if s.labels["kind"] == "cpu"
    }
    runq = fams["xhagent_runq_latency_seconds"].samples
    waited = {s.labels["group"]: s.value for s in runq if s.name.endswith("_count")}
    for tid in ids:
        assert delays.get(f"tasks/{tid}", 0) > 0, delays  # waited for a CPU, per taskstats
        assert waited.get(f"tasks/{tid}", 0) > 0, waited  # and per the BPF probe
    # the subtree's own group holds no process (its leaves do): it has no run-queue series
    assert "shims" in waited and "subtree" not in waited
    assert [s for s in runq if "class" in s.labels] == []
    # the spinners' class, in the series by class as well
    (cls,) = {
        s.labels["class"]
        for s in fams["xhagent_tasks"].samples
        if s.labels["state"] == "Running" and s.value == len(ids)
    }
    by_class = {
        s.labels["class"]: s.value
        for s in fams["xhagent_class_runq_latency_seconds"].samples
        if s.name.endswith("_count")
    }
    assert by_class[cls] >= sum(waited[f"tasks/{tid}"] for tid in ids), by_class
    memory = {s.labels["class"]: s.value for s in fams["xhagent_class_memory_bytes"].samples}
    leaves = {s.labels["group"]: s.value for s in fams["xhagent_cgroup_memory_bytes"].samples}
    # 0 where the leaves have no memory.current (the memory controller left to cgroup v1)
    assert memory[cls] == sum(leaves.get(f"tasks/{tid}", 0) for tid in ids), (memory, leaves)


def test_a_tasks_cpu_time_is_in_its_record_and_in_its_class_counter(agent, tmp_path):
    from prometheus_client.parser import text_string_to_metric_families

    # about 0.3 s of CPU in the workload itself, in the real leaf the agent made for it
    burn = [
        "python3",
        "-c",
        "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass",
    ]
    task_id = submit(agent, tmp_path, "burn", burn)
    res = subprocess.run(
        [str(XHAGENT), "get", task_id, "--json", "--socket", str(agent.socket)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert res.returncode == 0, res.stderr
    task = json.loads(res.stdout)
    assert task["state"] == "Succeeded"
    wall_us = (task["ended_ns"] - task["started_ns"]) / 1000
    assert 300_000 <= task["cpu_usec"] <= wall_us * os.cpu_count(), task
    shown = subprocess.run(
        [str(XHAGENT), "get", task_id, "--socket", str(agent.socket)],
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout
    assert f"  cpu: {task['cpu_usec'] / 1e6:.3f} s used in " in shown
    with urllib.request.urlopen(agent.metrics_url(), timeout=10) as r:
        families = {f.name: f for f in text_string_to_metric_families(r.read().decode())}
    by_class = {s.labels["class"]: s.value for s in families["xhagent_task_cpu_seconds"].samples}
    assert by_class["batch"] >= task["cpu_usec"] / 1e6, by_class
