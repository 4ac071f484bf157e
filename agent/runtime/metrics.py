"""A Pool's figures as Prometheus metrics: `registry.register(PoolCollector(pool))`.

Read from `pool.stats()` at scrape time (what the workers last reported with their
results; a worker reports at least every half second while its preemption counts move).
Labels are bounded by the pool's workers: `worker` (its index) and `cpu`.

    xhagent_pool_workers{state}                       alive / retiring / gone
    xhagent_pool_tasks_queued{worker,cpu}             on the worker's own ring
    xhagent_pool_global_tasks_queued                  on the global ring
    xhagent_pool_tasks_running{worker,cpu}            taken and claimed, not yet done
    xhagent_pool_tasks_total{worker,cpu}              done (a result or an exception)
    xhagent_pool_contexts{worker,cpu,state}           free / running / blocked
    xhagent_pool_contexts_created_total{worker,cpu}
    xhagent_pool_steals_total{worker,cpu}
    xhagent_pool_preempt_signals_total{worker,cpu}    time-slice signals the worker saw
    xhagent_pool_preemptions_total{worker,cpu}        of those, the ones that switched tasks
"""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

CONTEXT_STATES = ("free", "running", "blocked")


class PoolCollector:
    """A prometheus_client collector of one Pool (register it on any registry)."""

    def __init__(self, pool):
        self.pool = pool

    def describe(self):
        return []  # families are built at collect time; nothing to pre-register

    def collect(self):
        stats = self.pool.stats()
        workers = stats["workers"]
        labels = ["worker", "cpu"]

        def family(kind, name, text, extra=()):
            return kind(name, text, labels=labels + list(extra))

        state = GaugeMetricFamily(
            "xhagent_pool_workers", "The pool's workers, by state.", labels=["state"]
        )
        counts = {"alive": 0, "retiring": 0, "gone": 0}
        for w in workers:
            counts[
                "alive"
                if w["alive"] and not w["retiring"]
                else "retiring"
                if w["alive"]
                else "gone"
            ] += 1
        for name, n in counts.items():
            state.add_metric([name], n)
        yield state
        glob = GaugeMetricFamily(
            "xhagent_pool_global_tasks_queued", "Tasks on the pool's global ring."
        )
        glob.add_metric([], stats["global"])
        yield glob

        queued = family(
            GaugeMetricFamily,
            "xhagent_pool_tasks_queued",
            "Tasks on the worker's own ring (others may steal them).",
        )
        running = family(
            GaugeMetricFamily,
            "xhagent_pool_tasks_running",
            "Tasks the worker has taken and not yet reported done.",
        )
        done = family(
            CounterMetricFamily, "xhagent_pool_tasks", "Tasks the worker ran to an outcome."
        )
        contexts = family(
            GaugeMetricFamily,
            "xhagent_pool_contexts",
            "The worker's task contexts, by state (free: Idle or Reused).",
            ["state"],
        )
        created = family(
            CounterMetricFamily,
            "xhagent_pool_contexts_created",
            "Task contexts the worker has made.",
        )
        steals = family(
            CounterMetricFamily, "xhagent_pool_steals", "Steals by the worker from another's ring."
        )
        signals = family(
            CounterMetricFamily,
            "xhagent_pool_preempt_signals",
            "Time-slice signals (BPF or CPU-clock timer) the worker saw.",
        )
        preemptions = family(
            CounterMetricFamily,
            "xhagent_pool_preemptions",
            "Time-slice signals that switched the running task out.",
        )
        for w in workers:
            key = [str(w["index"]), str(w["cpu"])]
            queued.add_metric(key, w["queued"])
            running.add_metric(key, w["running"])
            done.add_metric(key, w["done"])
            created.add_metric(key, w["contexts"])
            steals.add_metric(key, w["steals"])
            signals.add_metric(key, w["preempt_signals"])
            preemptions.add_metric(key, w["preemptions"])
            for s in CONTEXT_STATES:
                n = w[f"contexts_{s}"]
                if n is not None:  # None until the worker's first report
                    contexts.add_metric(key + [s], n)
        yield from (queued, running, done, contexts, created, steals, signals, preemptions)
