"""`kind: Task`: the unified TaskSpec of seed 003 (2.2) for CPU, GPU and TPU work.

    apiVersion: xh.scheduling/v1
    kind: Task
    metadata: {name: infer-1, labels: {app: video-ai-infer}}
    spec:
      deviceType: gpu                 # cpu | gpu | tpu
      requests: {cpus: 4, memory: 8GiB, gpus: 1, gpuMemory: 16GiB}
      deadline: 250ms                 # after submission, or 2026-11-29T17:00:00.000000001Z
      priority: 80                    # 0..100; default: the winning policy's priority
      estimatedRuntime: 40ms
      migratable: true
      runsOn: [gpu, tpu]              # device types a move may take it to (default: its own)
      resources: [pcie-switch]        # exclusive: held from its start to its end
      computeGraphHash: <64 hex digits, SHA-256>
      memoryLayout: NCHW@64B
      streamId: 3                     # gpu, tpu only; numThreads: cpu; coreAssignment: tpu
      command: [python3, serve.py, --stream, "7"]   # argv; required to run
      env: {MODEL: resnet50, BATCH: "8"}
      workingDir: /srv/infer
      user: infer:video               # resolved when the task starts
      class: latency                  # default batch
      restartPolicy: {policy: OnFailure, maxRestarts: 5, backoff: 500ms}
      preemption: kill                # freeze (default) | kill | never
      enforce: [cpuset, memory]
      trace: true                     # its scheduler events recorded per attempt
      traceStacks: kernel             # each switch-out's stack: kernel, user or both (none)

`requests.gpuMemory` is per GPU and shares the GPU; without it (and without a policy's
`minMemoryGB`) each GPU is taken whole. The fields from `command` on say how the task runs
(`xhagent.policy.task_exec` has their rules and defaults); placement reads none of them, so
a Task file for `policy explain` may leave them out, and `command` is required only where
the task is to run (`parse_task(doc, require_command=True)`).
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from typing import Any

from ..quantity import format_size, parse_size
from ..spec import Cursor, Document
from .policy import API_VERSION, parse_header, parse_metadata
from .task_exec import (
    DEFAULT_CLASS,
    DEFAULT_PREEMPTION,
    EXEC_FIELDS,
    Checkpoint,
    RestartPolicy,
    RunAs,
    distinct_choices,
    dump_exec,
    key_error,
    parse_exec,
)
from .task_exec import require_command as _require_command
from .units import format_duration, format_instant, parse_duration_ns, parse_instant_ns

DEVICE_TYPES = ("cpu", "gpu", "tpu")
MIGRATABLE_TYPES = ("gpu", "tpu")  # what `runsOn` may list: the accelerators a move goes to
# fields that mean something only for `migratable: true`, with why (for the error)
MIGRATION_FIELDS = {
    "runsOn": "(the device types the agent may move the task to)",
    "checkpoint": "(it runs when the agent moves the task to another device)",
}
# field -> device types it belongs to (seed 003, 2.2 table; requests.gpus follows streamId's logic)
DEVICE_FIELDS = {"numThreads": ("cpu",), "streamId": ("gpu", "tpu"), "coreAssignment": ("tpu",)}
GPU_REQUESTS = ("gpus", "gpuMemory")
_HASH = re.compile(r"[0-9a-f]{64}")
_LAYOUT = re.compile(r"[A-Za-z0-9_]{1,16}(@\d+B)?")
_LOOKS_ABSOLUTE = re.compile(r"\d{4}-\d\d-\d\d")


@dataclass(frozen=True)
class Deadline:
    ns: int
    relative: bool  # True: ns after submission; False: ns since the epoch

    def at(self, submitted_ns: int) -> int:
        return submitted_ns + self.ns if self.relative else self.ns

    def dump(self) -> str:
        return format_duration(self.ns) if self.relative else format_instant(self.ns)


@dataclass(frozen=True)
class Requests:
    cpus: int | None = None
    memory: int | None = None
    gpus: int | None = None
    gpu_memory: int | None = None


@dataclass(frozen=True)
class Task:
    name: str
    device_type: str
    labels: tuple[tuple[str, str], ...] = ()
    requests: Requests = Requests()
    deadline: Deadline | None = None
    priority: int | None = None
    estimated_runtime_ns: int | None = None
    migratable: bool | None = None
    runs_on: tuple[str, ...] = ()  # device types a migration may move it to; (): its own
    # exclusive resources it holds from its start to its end: a task that needs one another
    # holds waits (ResourceHeld), and under edf-pic lends the holder its class's weights
    resources: tuple[str, ...] = ()
    compute_graph_hash: str | None = None
    memory_layout: str | None = None
    num_threads: int | None = None
    stream_id: int | None = None
    core_assignment: tuple[int, ...] | None = None
    # How it runs (task_exec): None or () where the file leaves a field out.
    command: tuple[str, ...] | None = None
    env: tuple[tuple[str, str], ...] = ()
    working_dir: str | None = None
    user: RunAs | None = None
    task_class: str = DEFAULT_CLASS
    restart_policy: RestartPolicy = RestartPolicy()
    preemption: str = DEFAULT_PREEMPTION
    enforce: tuple[str, ...] = ()
    checkpoint: Checkpoint | None = None
    trace: bool = False  # record its scheduler events (xhagent.daemon.exec.tracing)
    trace_stacks: str = "none"  # with trace: "kernel" takes stacks at each switch-out

    @property
    def label_map(self) -> dict[str, str]:
        return dict(self.labels)


def parse_deadline(value: Any) -> Deadline:
    if isinstance(value, dt.datetime):
        # YAML's own timestamps keep microseconds at most: digits beyond would vanish silently.
        raise ValueError(
            "quote the time ('2026-11-29T17:00:00.000000001Z') so its nanoseconds are kept"
        )
    if isinstance(value, str) and _LOOKS_ABSOLUTE.match(value):
        return Deadline(parse_instant_ns(value), relative=False)
    ns = parse_duration_ns(value)
    if ns <= 0:
        raise ValueError("a relative deadline must be positive")
    return Deadline(ns, relative=True)


SPEC_FIELDS = {
    "deviceType",
    "requests",
    "deadline",
    "priority",
    "estimatedRuntime",
    "migratable",
    "runsOn",
    "resources",
    "computeGraphHash",
    "memoryLayout",
    *DEVICE_FIELDS,
    *EXEC_FIELDS,
}


def parse_task(doc: Document, require_command: bool = False) -> Task:
    """A Task; every error of the document at once (SpecErrors). `require_command`: the task
    is to run, so a missing `spec.command` is one of those errors."""
    if not parse_header(doc):
        doc.errors.raise_if_any()
    name, labels = parse_metadata(doc.root)
    spec, fields = doc.root["spec"], {}
    if spec.present and spec.fields(SPEC_FIELDS, required={"deviceType"}):
        fields = {**_spec(spec), **parse_exec(spec)}
        for key, why in MIGRATION_FIELDS.items():
            if spec[key].present and fields.get("migratable") is not True:
                doc.errors.add(
                    key_error(spec, key, f"spec.{key}: only for a task with migratable: true {why}")
                )
    if require_command and isinstance(spec.value, dict):
        doc.attempt(lambda: _require_command(spec))
    doc.errors.raise_if_any()
    return Task(name=name, labels=labels, **fields)


def _spec(spec: Cursor) -> dict[str, Any]:
    doc = spec.doc
    device = (
        doc.attempt(lambda: spec["deviceType"].str(DEVICE_TYPES))
        if spec["deviceType"].present
        else None
    )
    if device is not None:
        for name, devices in DEVICE_FIELDS.items():
            if spec[name].present and device not in devices:
                doc.errors.add(
                    key_error(
                        spec,
                        name,
                        f"spec.{name} is only for deviceType {' or '.join(devices)} "
                        f"(this task is {device})",
                    )
                )
    return dict(
        device_type=device,
        requests=_requests(spec["requests"], device),
        deadline=doc.attempt(
            lambda: spec["deadline"].parse(
                parse_deadline,
                "deadline (a duration such as 250ms or an RFC 3339 time)",
                default=None,
            )
        ),
        priority=doc.attempt(lambda: spec["priority"].int(0, 100, default=None)),
        estimated_runtime_ns=doc.attempt(
            lambda: spec["estimatedRuntime"].parse(parse_duration_ns, "duration", default=None)
        ),
        migratable=doc.attempt(lambda: spec["migratable"].bool(default=None)),
        runs_on=doc.attempt(lambda: _runs_on(spec["runsOn"], device), ()),
        resources=doc.attempt(lambda: _resources(spec["resources"]), ()),
        compute_graph_hash=doc.attempt(
            lambda: _matching(
                spec["computeGraphHash"],
                _HASH,
                "expected a SHA-256 digest, 64 lowercase hex digits",
            )
        ),
        memory_layout=doc.attempt(
            lambda: _matching(
                spec["memoryLayout"],
                _LAYOUT,
                "expected a layout such as NCHW or NCHW@64B (at most 16 characters before @)",
            )
        ),
        num_threads=doc.attempt(lambda: spec["numThreads"].int(1, 1 << 16, default=None)),
        stream_id=doc.attempt(lambda: spec["streamId"].int(0, 1 << 31, default=None)),
        core_assignment=doc.attempt(lambda: _cores(spec["coreAssignment"])),
    )


def _runs_on(cur: Cursor, device: str | None) -> tuple[str, ...]:
    """`runsOn: [gpu, tpu]`: the accelerator types a migration may move the task to, its own
    deviceType among them (as a simulator workload's `runsOn`)."""
    if not cur.present:
        return ()
    if device == "cpu":
        raise cur.error(f"{cur.where}: only for deviceType gpu or tpu (this task is cpu)")
    kinds = distinct_choices(cur, MIGRATABLE_TYPES)
    if device is not None and device not in kinds:
        raise cur.error(
            f"{cur.where}: lists {', '.join(kinds) or 'nothing'}, not the deviceType {device}"
        )
    return kinds


# A resource's name: what an event, a reason and a metric label show (a DNS label).
RESOURCE_RE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
MAX_RESOURCES = 16  # named by one task


def _resources(cur: Cursor) -> tuple[str, ...]:
    """`resources: [pcie-switch, licence]`: exclusive, each named once."""
    if not cur.present:
        return ()
    items = cur.seq()
    if len(items) > MAX_RESOURCES:
        raise cur.error(f"{cur.where}: {len(items)} resources, more than {MAX_RESOURCES}")
    names: list[str] = []
    for item in items:
        name = item.str()
        if not RESOURCE_RE.fullmatch(name):
            raise item.error(
                f"{item.where}: {name[:70]!r} is not a resource name (lowercase letters, "
                "digits and '-', starting and ending with a letter or digit, at most 63)"
            )
        if name in names:
            raise item.error(f"{item.where}: {name!r} is listed twice")
        names.append(name)
    return tuple(names)


def _requests(req: Cursor, device: str | None) -> Requests:
    if not (req.present and req.fields({"cpus", "memory", "gpus", "gpuMemory"})):
        return Requests()
    doc = req.doc
    for name in GPU_REQUESTS:
        if req[name].present and device is not None and device != "gpu":
            doc.errors.add(
                key_error(
                    req,
                    name,
                    f"spec.requests.{name} is only for deviceType gpu (this task is {device})",
                )
            )
    return Requests(
        cpus=doc.attempt(lambda: req["cpus"].int(0, 1 << 16, default=None)),
        memory=doc.attempt(lambda: req["memory"].parse(parse_size, "size", default=None)),
        gpus=doc.attempt(lambda: req["gpus"].int(0, 1024, default=None)),
        gpu_memory=doc.attempt(lambda: req["gpuMemory"].parse(parse_size, "size", default=None)),
    )


def _matching(cur: Cursor, pattern: re.Pattern, message: str) -> str | None:
    value = cur.str(default=None)
    if value is not None and not pattern.fullmatch(value):
        raise cur.error(f"{cur.where}: {message}")
    return value


def _cores(cur: Cursor) -> tuple[int, ...] | None:
    if not cur.present:
        return None
    cores = tuple(c.int(0, 1 << 16) for c in cur.seq())
    if len(set(cores)) != len(cores):
        raise cur.error(f"{cur.where}: a core is listed twice")
    return cores


def dump_task(t: Task) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": t.name}
    if t.labels:
        meta["labels"] = dict(t.labels)
    spec: dict[str, Any] = {"deviceType": t.device_type}
    r = t.requests
    req = {
        k: v
        for k, v in (
            ("cpus", r.cpus),
            ("memory", _size(r.memory)),
            ("gpus", r.gpus),
            ("gpuMemory", _size(r.gpu_memory)),
        )
        if v is not None
    }
    if req:
        spec["requests"] = req
    optional = (
        ("deadline", t.deadline.dump() if t.deadline else None),
        ("priority", t.priority),
        (
            "estimatedRuntime",
            format_duration(t.estimated_runtime_ns) if t.estimated_runtime_ns is not None else None,
        ),
        ("migratable", t.migratable),
        ("runsOn", list(t.runs_on) if t.runs_on else None),
        ("resources", list(t.resources) if t.resources else None),
        ("computeGraphHash", t.compute_graph_hash),
        ("memoryLayout", t.memory_layout),
        ("numThreads", t.num_threads),
        ("streamId", t.stream_id),
        ("coreAssignment", list(t.core_assignment) if t.core_assignment is not None else None),
    )
    spec.update({k: v for k, v in optional if v is not None})
    spec.update(dump_exec(t))
    return {"apiVersion": API_VERSION, "kind": "Task", "metadata": meta, "spec": spec}


def _size(n: int | None):
    return None if n is None else format_size(n)
