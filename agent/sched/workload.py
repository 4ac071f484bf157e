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
          # runtime: constant{value} | uniform{min,max} | exponential{mean} | lognormal{mean,sigma}
          runtime: {distribution: exponential, mean: 5ms}
          deadlineSlack: {min: 2, max: 4}  # deadline = arrival + runtime x U(min, max)
                                           # (or, instead, deadline: 50ms)
          priority: 80         # or {values: [20, 80], weights: [3, 1]}
          resources: [pcie]    # exclusive, held while the job is unfinished
          affinity: {tier: hot}
          gpuMemory: 2Gi       # GPU jobs: bytes on the GPU (nodes with gpuMemory model it)
          migratable: true     # the migration controller may move it (default false)
          runsOn: [gpu, tpu]   # device types it can run on (default: its deviceType)
          sla: {p95Latency: 50ms, errorRate: 0.01}
      jobs:                    # explicit arrivals; fields default from their class
        - {name: j1, class: interactive, arrival: 0ms, runtime: 3ms, deadline: 10ms}
      queues:                  # mlq levels, most urgent first
        - {name: hot, matchLabels: {tier: hot}}
        - {name: bulk}

Durations are written as in Task files (`250ms`, `1.5s`, `1h30m`; a bare number is
seconds). Generation is deterministic: each class draws from its own `random.Random` seeded
with the run's seed and the class name.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from pathlib import Path

from ..policy.units import parse_duration_ns
from ..quantity import format_size, parse_size
from ..spec import Cursor, SpecError, SpecErrors, load_file, load_text
from .job import DEVICE_TYPES, Job
from .metrics import Sla
from .mlq import Level, MultiLevel

DISTRIBUTIONS = {
    "constant": ("value",),
    "uniform": ("min", "max"),
    "exponential": ("mean",),
    "lognormal": ("mean", "sigma"),
}


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
    gpu_memory: int = 0
    migratable: bool = False
    runs_on: frozenset[str] = frozenset()

    def job(self, name: str, arrival: int, runtime: int, rng: random.Random, **explicit) -> Job:
        if "deadline_ns" not in explicit:
            if self.slack is not None:
                explicit["deadline_ns"] = arrival + round(runtime * rng.uniform(*self.slack))
            elif self.deadline_ns is not None:
                explicit["deadline_ns"] = arrival + self.deadline_ns
        if "priority" not in explicit:
            values, weights = self.priorities
            explicit["priority"] = rng.choices(values, weights)[0]
        fields = dict(
            cls=self.name,
            device=self.device,
            holds=self.resources,
            affinity=self.affinity,
            gpu_memory=self.gpu_memory,
            migratable=self.migratable,
            runs_on=self.runs_on,
        )
        fields.update(explicit)
        return Job(name, arrival, runtime, **fields)


class TooManyJobs(ValueError):
    def __init__(self, limit: int, cls: str):
        super().__init__(
            f"the workload generates more than {limit} jobs ({cls} among them); "
            "lower its rates or duration, or raise --max-jobs"
        )
        self.limit = limit


@dataclass
class Workload:
    name: str = "workload"
    duration_ns: int = 10_000_000_000
    utilisation: float | None = None
    window_ns: int = 1_000_000_000
    classes: dict[str, JobClass] = field(default_factory=dict)
    explicit: list[Job] = field(default_factory=list)
    levels: MultiLevel | None = None
    # Where each class's or explicit job's gpuMemory is written, to place the error of a
    # demand no GPU of the nodes can hold.
    gpu_memory_at: dict[str, Cursor] = field(default_factory=dict)

    def check_gpu_memory(self, largest: int) -> None:
        """SpecError at every gpuMemory larger than `largest` (the largest GPU's memory)."""
        demands = [(c.gpu_memory, c.name) for c in self.classes.values()]
        demands += [(j.gpu_memory, j.name) for j in self.explicit]
        errors = [
            self.gpu_memory_at[name].error(
                f"gpuMemory {format_size(size)} is more than the largest GPU "
                f"of the nodes has ({format_size(largest)})"
            )
            for size, name in demands
            if size > largest and name in self.gpu_memory_at
        ]
        if errors:
            raise errors[0] if len(errors) == 1 else SpecErrors(errors)

    @property
    def slas(self) -> dict[str, Sla]:
        return {name: c.sla for name, c in self.classes.items()}

    def generate(
        self, seed: int, capacity: dict[str, int], max_jobs: int | None = None
    ) -> list[Job]:
        """Explicit jobs plus Poisson arrivals per class; rates scaled to `utilisation` of
        `capacity` (slots per device type) when that is set. TooManyJobs, as soon as there
        would be more than `max_jobs`, keeps memory and time bounded whatever the rates."""
        scale = self._rate_scale(capacity)
        jobs = list(self.explicit)
        limit = float("inf") if max_jobs is None else max_jobs
        if len(jobs) > limit:
            raise TooManyJobs(max_jobs, "explicit jobs")
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
                if len(jobs) >= limit:
                    raise TooManyJobs(max_jobs, f"class {cls.name}")
                jobs.append(cls.job(f"{cls.name}-{i}", int(t), cls.runtime.draw(rng), rng))
                i += 1
        return jobs

    def _rate_scale(self, capacity: dict[str, int]) -> dict[str, float]:
        if self.utilisation is None:
            return {}
        offered: dict[str, float] = {}
        for cls in self.classes.values():
            offered[cls.device] = offered.get(cls.device, 0.0) + cls.rate * cls.runtime.mean / 1e9
        return {
            d: self.utilisation * capacity.get(d, 0) / load
            for d, load in offered.items()
            if load > 0
        }


# -- parsing ------------------------------------------------------------------------------
# Bounds that keep every generated time a finite integer: a year of simulated time, and
# deadlines at most a thousand runtimes away.
MAX_DURATION_NS = 365 * 24 * 3600 * 10**9
MAX_SLACK = 1000.0
MAX_RATE = 10**9  # arrivals per second; --max-jobs bounds how many are generated in all


def _duration(c: Cursor, default=...) -> int:
    value = c.parse(
        parse_duration_ns, "duration", **({} if default is ... else {"default": default})
    )
    if value is not None and not 0 <= value <= MAX_DURATION_NS:
        raise c.error(f"{c.where}: {c.value!r} is out of range 0..365d")
    return value


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
    if not any(weights):
        raise c["weights"].error(f"{c['weights'].where}: at least one weight must be positive")
    return values, weights


CLASS_FIELDS = {
    "name",
    "deviceType",
    "rate",
    "runtime",
    "deadlineSlack",
    "deadline",
    "priority",
    "resources",
    "affinity",
    "sla",
    "gpuMemory",
    "migratable",
    "runsOn",
}
JOB_FIELDS = {
    "name",
    "class",
    "deviceType",
    "arrival",
    "runtime",
    "deadline",
    "priority",
    "resources",
    "affinity",
    "gpuMemory",
    "migratable",
    "runsOn",
}


def _runs_on(c: Cursor, device: str | None) -> frozenset[str]:
    """`runsOn: [gpu, tpu]`: the device types a job may run on, its own among them."""
    kinds = frozenset(k.str(DEVICE_TYPES) for k in c.seq())
    if device is not None and device not in kinds:
        raise c.error(
            f"{c.where}: lists {', '.join(sorted(kinds)) or 'nothing'}, not the deviceType {device}"
        )
    return kinds


def _job_class(c: Cursor) -> JobClass | None:
    """The class at `c`, or None when one of its fields is wrong (each error is kept)."""
    errors = c.doc.errors.total
    if not c.fields(CLASS_FIELDS, required={"name"}):
        return None
    cls = JobClass(
        c.doc.attempt(lambda: c["name"].str(), "?"),
        device=c.doc.attempt(lambda: c["deviceType"].str(DEVICE_TYPES, default="cpu"), "cpu"),
        rate=c.doc.attempt(lambda: c["rate"].number(0, MAX_RATE, default=0.0), 0.0),
        runtime=c.doc.attempt(lambda: _runtime(c["runtime"]), Runtime("constant", (1,))),
        priorities=c.doc.attempt(lambda: _priorities(c["priority"]), ((50,), (1.0,))),
        resources=c.doc.attempt(
            lambda: frozenset(r.str() for r in c["resources"].seq(default=[])), frozenset()
        ),
        affinity=c.doc.attempt(lambda: _labels(c["affinity"]), {}),
        gpu_memory=c.doc.attempt(lambda: _gpu_memory(c["gpuMemory"]), 0),
        migratable=c.doc.attempt(lambda: c["migratable"].bool(default=False), False),
    )
    if c["runsOn"].present:
        cls.runs_on = c.doc.attempt(lambda: _runs_on(c["runsOn"], cls.device), frozenset())
    if c["deadlineSlack"].present:
        cls.slack = c.doc.attempt(lambda: _slack(c["deadlineSlack"]))
    if c["deadline"].present:
        with c.doc.collecting():
            if cls.slack is not None:
                raise c["deadline"].error("give either deadline or deadlineSlack, not both")
            cls.deadline_ns = _duration(c["deadline"])
    if c["sla"].present:
        with c.doc.collecting():
            s = c["sla"].mapping({"p95Latency", "errorRate"})
            cls.sla = Sla(
                _duration(s["p95Latency"], None), s["errorRate"].number(0, 1, default=None)
            )
    return cls if c.doc.errors.total == errors else None


def _gpu_memory(c: Cursor) -> int:
    """Bytes on the GPU: a size (`2Gi`, `512Mi`, a bare number of bytes), never negative."""
    return c.parse(parse_size, "size", default=0)


def _slack(c: Cursor) -> tuple[float, float]:
    c.mapping({"min", "max"}, required={"min", "max"})
    slack = (c["min"].number(1, MAX_SLACK), c["max"].number(1, MAX_SLACK))
    if slack[0] > slack[1]:
        raise c["min"].error("deadlineSlack.min is larger than deadlineSlack.max")
    return slack


def _explicit_job(
    c: Cursor, classes: dict[str, JobClass], declared: set[str], index: int
) -> Job | None:
    """The job at `c`, or None when one of its fields is wrong (each error is kept). A job of
    a declared class that had errors of its own is checked against a stand-in class."""
    errors = c.doc.errors.total
    if not c.fields(JOB_FIELDS, required={"runtime"}):
        return None
    cls_name = c.doc.attempt(
        lambda: c["class"].str(declared, default=None) if declared else c["class"].str(default=None)
    )
    cls = classes.get(cls_name) or JobClass(cls_name or "default")
    explicit = {}
    arrival = c.doc.attempt(lambda: _duration(c["arrival"], 0), 0)
    if c["deadline"].present:
        explicit["deadline_ns"] = c.doc.attempt(lambda: arrival + _duration(c["deadline"]))
    if c["priority"].present:
        explicit["priority"] = c.doc.attempt(lambda: c["priority"].int(0, 100))
    if c["deviceType"].present:
        explicit["device"] = c.doc.attempt(lambda: c["deviceType"].str(DEVICE_TYPES))
    if c["resources"].present:
        explicit["holds"] = c.doc.attempt(lambda: frozenset(r.str() for r in c["resources"].seq()))
    if c["affinity"].present:
        explicit["affinity"] = c.doc.attempt(lambda: _labels(c["affinity"]))
    if c["gpuMemory"].present:
        explicit["gpu_memory"] = c.doc.attempt(lambda: _gpu_memory(c["gpuMemory"]))
    if c["migratable"].present:
        explicit["migratable"] = c.doc.attempt(lambda: c["migratable"].bool())
    if c["runsOn"].present:
        device = explicit.get("device", cls.device)
        explicit["runs_on"] = c.doc.attempt(lambda: _runs_on(c["runsOn"], device))
    elif "device" in explicit and cls.runs_on and explicit["device"] not in cls.runs_on:
        explicit["runs_on"] = frozenset()
    runtime = c.doc.attempt(lambda: _duration(c["runtime"]))
    name = c.doc.attempt(lambda: c["name"].str(default=f"job-{index}"))
    with c.doc.collecting():
        if runtime is not None and runtime <= 0:
            raise c["runtime"].error(f"{c['runtime'].where}: a runtime must be positive")
    if c.doc.errors.total != errors:
        return None
    return cls.job(name, arrival, runtime, random.Random(f"explicit:{index}"), **explicit)


def _levels(c: Cursor) -> MultiLevel:
    levels = []
    for item in c.seq():
        item.mapping({"name", "matchLabels"}, required={"name"})
        levels.append(Level(item["name"].str(), _labels(item["matchLabels"])))
    if not levels:
        raise c.error("queues: give at least one level")
    return MultiLevel(tuple(levels))


def parse(doc_root: Cursor) -> Workload:
    """The Workload at `doc_root`; SpecErrors with every error of the document, in file order."""
    doc = doc_root.doc
    root = doc_root.mapping()
    root.fields({"apiVersion", "kind", "metadata", "spec"}, required={"kind", "spec"})
    with doc.collecting():
        if root["kind"].str() != "Workload":
            raise root["kind"].error(f"kind: expected Workload, got {root['kind'].value!r}")
    with doc.collecting():
        if root["apiVersion"].present and root["apiVersion"].str() != "xh.scheduling/v1":
            raise root["apiVersion"].error("apiVersion: expected xh.scheduling/v1")
    name = doc.attempt(
        lambda: (
            root["metadata"]["name"].str(default="workload")
            if root["metadata"].present
            else "workload"
        ),
        "workload",
    )
    spec = root["spec"]
    if not isinstance(spec.value, dict):  # nothing inside can be checked
        if spec.present:
            spec.fields()
        doc.errors.raise_if_any()
    spec.fields({"duration", "utilisation", "slaWindow", "classes", "jobs", "queues"})
    w = Workload(
        name,
        duration_ns=doc.attempt(lambda: _duration(spec["duration"], 10_000_000_000), 0),
        utilisation=doc.attempt(lambda: spec["utilisation"].number(0.0, 10.0, default=None)),
    )
    with doc.collecting():
        w.window_ns = _duration(spec["slaWindow"], 1_000_000_000)
        if w.window_ns <= 0:
            raise spec["slaWindow"].error("slaWindow must be positive")
    declared = set()
    for c in doc.attempt(lambda: spec["classes"].seq(default=[]), []):
        if isinstance(c["name"].value, str):
            declared.add(c["name"].value)
        cls = _job_class(c)
        with doc.collecting():
            if cls is not None and cls.name in w.classes:
                raise c["name"].error(f"duplicate class {cls.name!r}")
            if cls is not None:
                w.classes[cls.name] = cls
                if c["gpuMemory"].present:
                    w.gpu_memory_at[cls.name] = c["gpuMemory"]
    seen = set()
    for i, c in enumerate(doc.attempt(lambda: spec["jobs"].seq(default=[]), [])):
        job = _explicit_job(c, w.classes, declared, i)
        if job is None:
            continue
        with doc.collecting():
            if job.name in seen:
                raise c["name"].error(f"duplicate job name {job.name!r}")
            seen.add(job.name)
            w.explicit.append(job)
            if c["gpuMemory"].present or job.cls in w.gpu_memory_at:
                w.gpu_memory_at[job.name] = (
                    c["gpuMemory"] if c["gpuMemory"].present else w.gpu_memory_at[job.cls]
                )
    if spec["queues"].present:
        w.levels = doc.attempt(lambda: _levels(spec["queues"]))
    doc.errors.raise_if_any()
    if not w.classes and not w.explicit:
        raise spec.error("a workload needs classes or jobs")
    return w


def load_workload(path: str | Path) -> Workload:
    docs = load_file(path)
    if not docs:
        raise SpecError(str(path), 1, 1, "empty file: expected a Workload document")
    return parse(docs[0].root)


def load_workload_text(text: str, file: str = "<string>") -> Workload:
    docs = load_text(text, file)
    if not docs:
        raise SpecError(file, 1, 1, "empty file: expected a Workload document")
    return parse(docs[0].root)
