"""What a recording shows while it runs: `xhagent trace record --metrics-addr HOST:PORT`
serves these on /metrics (the agent's exporter, `xhagent.metrics.exporter`).

    xhagent_trace_events_total        events the BPF program delivered to the recorder
    xhagent_trace_lost_events_total   events lost (a per-CPU ring buffer was full)
    xhagent_trace_recording_seconds   how long the recording has run

Updated with the recorder's progress (once a second) and at its end.
"""

from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily


class TraceMetrics:
    """The figures of one recording; `update` from the recorder's thread, `collect` from
    the exporter's."""

    def __init__(self):
        self._lock = threading.Lock()
        self._figures = (0, 0, 0.0)  # events, lost, seconds
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def update(self, events: int, lost: int, elapsed: float) -> None:
        with self._lock:
            self._figures = (events, lost, elapsed)

    def collect(self):
        with self._lock:
            events, lost, elapsed = self._figures
        fams = (
            (CounterMetricFamily, "xhagent_trace_events", "Scheduler events recorded.", events),
            (
                CounterMetricFamily,
                "xhagent_trace_lost_events",
                "Scheduler events lost: a per-CPU ring buffer was full.",
                lost,
            ),
            (
                GaugeMetricFamily,
                "xhagent_trace_recording_seconds",
                "How long the recording has run.",
                elapsed,
            ),
        )
        for kind, name, text, value in fams:
            fam = kind(name, text)
            fam.add_metric([], value)
            yield fam
