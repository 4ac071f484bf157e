"""Workload files for the simulator: classes that generate jobs, and/or explicit jobs.

    apiVersion: xh.scheduling/v1
    kind: Workload
    metadata: {name: mixed}
    spec:
      duration: 20s            # arrivals are generated in [0, duration)
      utilisation: 0.8         # optional: scale class rates so each device type is this busy
      slaWindow: 1s            # window for the SLA violation rate
      classes:
        - name: interactive
          deviceType: cpu      # cpu | gpu | tpu
          rate: 40             # Poisson arrivals per second (0: explicit jobs only)
          runtime: {distribution: exponential, mean: 5ms}   # constant{value} uniform{min,max} lognormal{mean,sigma}
          deadlineSlack: {min: 2, max: 4}   # deadline = arrival + runtime x U(min, max); or deadline: 50ms
          priority: 80         # or {values: [20, 80], weights: [3, 1]}
          resources: [pcie]    # exclusive, held while the job is unfinished
          affinity: {tier: hot}
          sla: {p95Latency: 50ms, errorRate: 0.01}
      jobs:                    # explicit arrivals; fields default from their class
        - {name: j1, class: interactive, arrival: 0ms, runtime: 3ms, deadline: 10ms}
      queues:                  # mlq levels, most urgent first
        - {name: hot, matchLabels: {tier: hot}}
        - {name: bulk}

Durations are written as in Task files (`250ms`, `1.5s`, `1h30m`; a bare number is
seconds). Generation is deterministic: each class draws from its own `random.Random` seeded with
the run's seed and the class name.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from pathlib import Path

from ..policy.units import parse_duration_ns
from ..spec import Cursor, SpecError, load_file, load_text
from .job import DEVICE_TYPES, Job
from .metrics import Sla
from .mlq import Level, MultiLevel

DISTRIBUTIONS = {"constant": ("value",), "uniform": ("min", "max"), "exponential": ("mean",),
                 "lognormal": ("mean", "sigma")}


@dataclass(frozen=True)
class Runtime:
    distribution: str
    params: tuple[float, ...]

    @property
    def mean(self) -> float:
        if self.distribution == "uniform":
            return (self.params[0] + self.params[1]) / 2
        return self.params[0]

    def draw(self, rng: random.Random) -> int:
        d, p = self.distribution, self.params
        if d == "constant":
            value = p[0]
        elif d == "uniform":
            value = rng.uniform(p[0], p[1])
        elif d == "exponential":
            value = rng.expovariate(1 / p[0])
        else:  # lognormal with the given mean: mu chosen so E[X] = mean
            value = rng.lognormvariate(math.log(p[0]) - p[1] ** 2 / 2, p[1])
        return max(1, round(value))


@dataclass
class JobClass:
    name: str
    device: str = "cpu"
    rate: float = 0.0
    runtime: Runtime = Runtime("constant", (1_000_000,))
    slack: tuple[float, float] | None = None
    deadline_ns: int | None = None
    priorities: tuple[tuple[int, ...], tuple[float, ...]] = ((50,), (1.0,))
    resources: frozenset[str] = frozenset()
    affinity: dict[str, str] = field(default_factory=dict)
    sla: Sla = Sla()

    def job(self, name: str, arrival: int, runtime: int, rng: random.Random, **explicit) -> Job:
        if "deadline_ns" not in explicit:
            if self.slack is not None:
                explicit["deadline_ns"] = arrival + round(runtime * rng.uniform(*self.slack))
            elif self.deadline_ns is not None:
                explicit["deadline_ns"] = arrival + self.deadline_ns
        if "priority" not in explicit:
            values, weights = self.priorities
            explicit["priority"] = rng.choices(values, weights)[0]
        fields = dict(cls=self.name, device=self.device, holds=self.resources, affinity=self.affinity)
        fields.update(explicit)
        return Job(name, arrival, runtime, **fields)


@dataclass
class Workload:
    name: str = "workload"
    duration_ns: int = 10_000_000_000
    utilisation: float | None = None
    window_ns: int = 1_000_000_000
    classes: dict[str, JobClass] = field(default_factory=dict)
    explicit: list[Job] = field(default_factory=list)
    levels: MultiLevel | None = None

    @property
    def slas(self) -> dict[str, Sla]:
        return {name: c.sla for name, c in self.classes.items()}

    def generate(self, seed: int, capacity: dict[str, int]) -> list[Job]:
        """Explicit jobs plus Poisson arrivals per class; rates scaled to `utilisation` of
        `capacity` (slots per device type) when that is set."""
        scale = self._rate_scale(capacity)
        jobs = list(self.explicit)
        for cls in self.classes.values():
            rate = cls.rate * scale.get(cls.device, 1.0)
            if rate <= 0:
                continue
            rng = random.Random(f"{seed}:{cls.name}")
            t, i = 0.0, 0
            while True:
                t += rng.expovariate(rate) * 1e9
                if t >= self.duration_ns:
                    break
                jobs.append(cls.job(f"{cls.name}-{i}", int(t), cls.runtime.draw(rng), rng))
                i += 1
        return jobs

    def _rate_scale(self, capacity: dict[str, int]) -> dict[str, float]:
        if self.utilisation is None:
            return {}
        offered: dict[str, float] = {}
        for cls in self.classes.values():
            offered[cls.device] = offered.get(cls.device, 0.0) + cls.rate * cls.runtime.mean / 1e9
        return {d: self.utilisation * capacity.get(d, 0) / load for d, load in offered.items() if load > 0}


# -- parsing ------------------------------------------------------------------------------
def _duration(c: Cursor, default=...) -> int:
    return c.parse(parse_duration_ns, "duration", **({} if default is ... else {"default": default}))


def _labels(c: Cursor) -> dict[str, str]:
    if not c.present:
        return {}
    return {str(k): v.str() for k, v in c.items()}


def _runtime(c: Cursor) -> Runtime:
    if not c.present:
        return Runtime("constant", (1_000_000,))
    if not isinstance(c.value, dict):
        return Runtime("constant", (_duration(c),))
    dist = c["distribution"].str(DISTRIBUTIONS, default="constant")
    names = DISTRIBUTIONS[dist]
    c.mapping({"distribution", *names}, required=names)
    if dist == "lognormal":
        return Runtime(dist, (_duration(c["mean"]), c["sigma"].number(0, 5)))
    params = tuple(_duration(c[n]) for n in names)
    if dist == "uniform" and params[0] > params[1]:
        raise c["min"].error("runtime.min is larger than runtime.max")
    if 0 in params:
        raise c.error("a runtime must be positive")
    return Runtime(dist, params)


def _priorities(c: Cursor) -> tuple[tuple[int, ...], tuple[float, ...]]:
    if not c.present or not isinstance(c.value, dict):
        return (c.int(0, 100, default=50),), (1.0,)
    c.mapping({"values", "weights"}, required={"values"})
    values = tuple(v.int(0, 100) for v in c["values"].seq())
    weights = tuple(w.number(0) for w in c["weights"].seq(default=[])) or (1.0,) * len(values)
    if not values or len(weights) != len(values):
        raise c.error("priority: values and weights must be non-empty lists of the same length")
    return values, weights


CLASS_FIELDS = {"name", "deviceType", "rate", "runtime", "deadlineSlack", "deadline", "priority",
                "resources", "affinity", "sla"}
JOB_FIELDS = {"name", "class", "deviceType", "arrival", "runtime", "deadline", "priority", "resources", "affinity"}


def _job_class(c: Cursor) -> JobClass:
    c.mapping(CLASS_FIELDS, required={"name"})
    cls = JobClass(c["name"].str(), device=c["deviceType"].str(DEVICE_TYPES, default="cpu"),
                   rate=c["rate"].number(0, default=0.0), runtime=_runtime(c["runtime"]),
                   priorities=_priorities(c["priority"]),
                   resources=frozenset(r.str() for r in c["resources"].seq(default=[])),
                   affinity=_labels(c["affinity"]))
    if c["deadlineSlack"].present:
        s = c["deadlineSlack"].mapping({"min", "max"}, required={"min", "max"})
        cls.slack = (s["min"].number(1), s["max"].number(1))
        if cls.slack[0] > cls.slack[1]:
            raise s["min"].error("deadlineSlack.min is larger than deadlineSlack.max")
    if c["deadline"].present:
        if cls.slack is not None:
            raise c["deadline"].error("give either deadline or deadlineSlack, not both")
        cls.deadline_ns = _duration(c["deadline"])
    if c["sla"].present:
        s = c["sla"].mapping({"p95Latency", "errorRate"})
        cls.sla = Sla(_duration(s["p95Latency"], None), s["errorRate"].number(0, 1, default=None))
    return cls


def _explicit_job(c: Cursor, classes: dict[str, JobClass], index: int) -> Job:
    c.mapping(JOB_FIELDS, required={"runtime"})
    cls_name = c["class"].str(classes, default=None) if classes else c["class"].str(default=None)
    cls = classes.get(cls_name) or JobClass(cls_name or "default")
    explicit = {}
    arrival = _duration(c["arrival"], 0)
    if c["deadline"].present:
        explicit["deadline_ns"] = arrival + _duration(c["deadline"])
    if c["priority"].present:
        explicit["priority"] = c["priority"].int(0, 100)
    if c["deviceType"].present:
        explicit["device"] = c["deviceType"].str(DEVICE_TYPES)
    if c["resources"].present:
        explicit["holds"] = frozenset(r.str() for r in c["resources"].seq())
    if c["affinity"].present:
        explicit["affinity"] = _labels(c["affinity"])
    runtime = _duration(c["runtime"])
    if runtime <= 0:
        raise c["runtime"].error("a runtime must be positive")
    rng = random.Random(f"explicit:{index}")
    return cls.job(c["name"].str(default=f"job-{index}"), arrival, runtime, rng, **explicit)


def parse(doc_root: Cursor) -> Workload:
    root = doc_root.mapping({"apiVersion", "kind", "metadata", "spec"}, required={"kind", "spec"})
    if root["kind"].str() != "Workload":
        raise root["kind"].error(f"kind: expected Workload, got {root['kind'].value!r}")
    if root["apiVersion"].present and root["apiVersion"].str() != "xh.scheduling/v1":
        raise root["apiVersion"].error("apiVersion: expected xh.scheduling/v1")
    name = root["metadata"]["name"].str(default="workload") if root["metadata"].present else "workload"
    spec = root["spec"].mapping({"duration", "utilisation", "slaWindow", "classes", "jobs", "queues"})
    w = Workload(name, duration_ns=_duration(spec["duration"], 10_000_000_000),
                 utilisation=spec["utilisation"].number(0.0, 10.0, default=None),
                 window_ns=_duration(spec["slaWindow"], 1_000_000_000))
    if w.window_ns <= 0:
        raise spec["slaWindow"].error("slaWindow must be positive")
    for c in spec["classes"].seq(default=[]):
        cls = _job_class(c)
        if cls.name in w.classes:
            raise c["name"].error(f"duplicate class {cls.name!r}")
        w.classes[cls.name] = cls
    seen = set()
    for i, c in enumerate(spec["jobs"].seq(default=[])):
        job = _explicit_job(c, w.classes, i)
        if job.name in seen:
            raise c["name"].error(f"duplicate job name {job.name!r}")
        seen.add(job.name)
        w.explicit.append(job)
    if spec["queues"].present:
        levels = []
        for c in spec["queues"].seq():
            c.mapping({"name", "matchLabels"}, required={"name"})
            levels.append(Level(c["name"].str(), _labels(c["matchLabels"])))
        if not levels:
            raise spec["queues"].error("queues: give at least one level")
        w.levels = MultiLevel(tuple(levels))
    if not w.classes and not w.explicit:
        raise spec.error("a workload needs classes or jobs")
    return w


def load(path: str | Path) -> Workload:
    docs = load_file(path)
    if not docs:
        raise SpecError(str(path), 1, 1, "empty file: expected a Workload document")
    return parse(docs[0].root)


def loads(text: str, file: str = "<string>") -> Workload:
    return parse(load_text(text, file)[0].root)
