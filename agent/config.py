"""The agent config, /etc/xhagent/agent.yaml: the node's name, labels and reserved CPUs
(what discovery adds to the node model), and where the daemon keeps and serves things.

    nodeName: gpu-07            # default: the host name
    labels: {rack: r12, zone: z1, pool: training}
    reservedCpus: "0,64"        # kernel cpu-list syntax, or a list of ints
    stateDir: /var/lib/xhagent  # tasks, events, outputs (SQLite and files)
    socket: /run/xhagent/xhagent.sock
    policiesDir: /etc/xhagent/policies.d
    subtree: xhagent.slice      # default: discovered (the delegated unit cgroup); the
                                # packaged unit passes --subtree, which wins
    logCap: 16Mi                # per task output stream
    adminGroup: xhagent-admin   # its members may do all root may through the API;
                                # "" for none (root and the agent's user only)
    pool:                       # a runtime worker pool the agent hosts (default: none)
      cpus: auto                # auto: every CPU the agent may use, reserved ones excluded;
                                # or a cpu list ("2-7", [2, 3])
      sliceMs: 10               # its preemption time slice (0: no preemption)
    metricsAddr: 0.0.0.0:9464   # HOST:PORT of /metrics, "off" for none (127.0.0.1:9464)
    logFormat: json             # text | json (text)
    debugEndpoints: "off"       # off | on | heap: /debug/* on the metrics address (off)
    maxStreams: 1024            # following API streams per caller (1024)
    taskSeries: 200             # running tasks with series of their own on /metrics (200)
    spareRunDirs: 1024          # run directories made ahead, while idle, for the first
                                # starts of a burst (1024: 16 MiB of the state disk; 0: none)
    shimServer: /run/xhagent-workloads/shims.sock
                                # `xhagent-shim --serve-at` to start workloads from
                                # (default: none: the agent starts its own server)

Every `xhagent run` option that is no path to a file of its own has its field here. Ground
floor: every package may read it; an option given to `xhagent run` wins over the file.

Validated as policies are: an unknown field is an error (with a did-you-mean), every error
of the file is reported at once, each `FILE:LINE:COL: message`; reserved CPUs must be
CPUs of this node (`check_reserved`, once the node's CPUs are known).
"""

from __future__ import annotations

import re
import socket
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from .cpulist import MAX_CPUS, format_cpulist, parse_cpulist
from .node_model import Labels, ModelError, format_path
from .quantity import parse_size
from .spec import Cursor, SpecError, load_file, load_text

DEFAULT_CONFIG = Path("/etc/xhagent/agent.yaml")
FIELDS = (
    "nodeName",
    "labels",
    "reservedCpus",
    "stateDir",
    "socket",
    "policiesDir",
    "subtree",
    "logCap",
    "adminGroup",
    "pool",
    "metricsAddr",
    "logFormat",
    "debugEndpoints",
    "maxStreams",
    "taskSeries",
    "spareRunDirs",
    "shimServer",
)
LOG_FORMATS = ("text", "json")
DEBUG_ENDPOINTS = ("off", "on", "heap")
MAX_STREAMS = 1 << 20
MAX_TASK_SERIES = 100_000
MAX_SPARE_RUN_DIRS = 1 << 20  # the most the shim's maker makes (shim_spares.c)
POOL_FIELDS = ("cpus", "sliceMs")
MAX_SLICE_MS = 10_000.0
PATHS = {
    "stateDir": "state_dir",
    "socket": "socket",
    "policiesDir": "policies_dir",
    "shimServer": "shim_server",
}
MAX_LOG_CAP = 1 << 40


class ConfigError(ModelError):
    """A bad agent config; reads as one `FILE:LINE:COL: message` line per error."""

    @classmethod
    def of(cls, exc: SpecError) -> ConfigError:
        return cls((), str(exc))


@dataclass(frozen=True)
class AgentConfig:
    node_name: str = field(default_factory=socket.gethostname)
    labels: Labels = field(default_factory=Labels, hash=False)
    reserved_cpus: tuple[int, ...] = ()
    state_dir: Path | None = None
    socket: Path | None = None
    policies_dir: Path | None = None
    subtree: str | None = None
    log_cap: int | None = None
    admin_group: str | None = None  # None: the default (xhagent-admin); "": none
    source: str | None = None
    reserved_at: str = field(default="", compare=False)  # FILE:LINE:COL of reservedCpus
    pool: PoolConfig | None = None
    # None: not in the file (the option's own default applies)
    metrics_addr: str | None = None  # HOST:PORT, checked, or "off"
    log_format: str | None = None
    debug_endpoints: str | None = None
    max_streams: int | None = None
    task_series: int | None = None
    spare_run_dirs: int | None = None
    shim_server: Path | None = None


@dataclass(frozen=True)
class PoolConfig:
    """The runtime pool `xhagent run` hosts: `cpus` None is auto (see daemon/pooling.py)."""

    cpus: tuple[int, ...] | None = None
    slice_ms: float = 10.0
    at: str = field(default="", compare=False)  # "FILE:LINE:COL: pool.cpus", for errors


def _cpus(c: Cursor, name: str) -> tuple[int, ...]:
    expected = f'{name}: expected a cpu list such as "0,64" or "0-1" or [0, 64]'
    if isinstance(c.value, list):
        return tuple(sorted({item.int(0, MAX_CPUS - 1) for item in c.seq()}))
    if isinstance(c.value, int) and not isinstance(c.value, bool):
        return (c.int(0, MAX_CPUS - 1),)
    if isinstance(c.value, str):
        try:
            return tuple(sorted(set(parse_cpulist(c.value))))
        except ValueError as exc:
            raise c.error(f"{expected}, got {c.value!r}: {exc}") from None
    raise c.error(f"{expected}, got {c.value!r}")


def _pool(c: Cursor, source: str) -> PoolConfig:
    c.mapping(POOL_FIELDS)
    cpus = c["cpus"]
    at = "{}:{}:{}".format(source, *c.doc.position(cpus.path if cpus.present else c.path))
    values: dict = {"at": f"{at}: {'pool.cpus' if cpus.present else 'pool'}"}
    if cpus.present and cpus.value != "auto":
        values["cpus"] = _cpus(cpus, "pool.cpus")
        if not values["cpus"]:
            raise cpus.error('pool.cpus: no CPU named (leave it out, or "auto", for all)')
    if c["sliceMs"].present:
        values["slice_ms"] = float(c["sliceMs"].number(0, MAX_SLICE_MS))
    return PoolConfig(**values)


def _labels(c: Cursor) -> Labels:
    try:
        return Labels._parse(c.value, c.path)
    except ModelError as exc:
        raise c.doc.error(exc.path, f"{format_path(exc.path)}: {exc.message}") from None


def parse_config(text: str, source: str) -> AgentConfig:
    try:
        docs = load_text(text, source)
    except SpecError as exc:
        raise ConfigError.of(exc) from None
    return _config(docs, source)


def _config(docs, source: str) -> AgentConfig:
    if not docs:
        return AgentConfig(source=source)
    doc = docs[0]
    root = doc.root
    if not isinstance(root.value, dict):
        raise ConfigError.of(root.error(f"expected a mapping with {', '.join(FIELDS)}"))
    values: dict = {}
    with doc.collecting():
        root.mapping(FIELDS)
    with doc.collecting():
        values["node_name"] = root["nodeName"].str(default=None) or socket.gethostname()
        if root["nodeName"].present and not root["nodeName"].value:
            raise root["nodeName"].error("nodeName: must not be empty")
    with doc.collecting():
        values["labels"] = _labels(root["labels"]) if root["labels"].present else Labels()
    with doc.collecting():
        if root["reservedCpus"].present:
            values["reserved_cpus"] = _cpus(root["reservedCpus"], "reservedCpus")
            values["reserved_at"] = "{}:{}:{}".format(source, *doc.position(("reservedCpus",)))
    for key, attr in PATHS.items():
        with doc.collecting():
            if root[key].present:
                values[attr] = _absolute(root[key])
    with doc.collecting():
        if root["subtree"].present:
            values["subtree"] = root["subtree"].str()
    with doc.collecting():
        if root["logCap"].present:
            values["log_cap"] = _size(root["logCap"])
    with doc.collecting():
        if root["adminGroup"].present:
            values["admin_group"] = _group_name(root["adminGroup"])
    with doc.collecting():
        if root["pool"].present:
            values["pool"] = _pool(root["pool"], source)
    with doc.collecting():
        if root["metricsAddr"].present:
            values["metrics_addr"] = _metrics_addr(root["metricsAddr"])
    with doc.collecting():
        if root["logFormat"].present:
            values["log_format"] = root["logFormat"].str(LOG_FORMATS)
    with doc.collecting():
        if root["debugEndpoints"].present:
            values["debug_endpoints"] = _switch(root["debugEndpoints"], DEBUG_ENDPOINTS)
    with doc.collecting():
        if root["maxStreams"].present:
            values["max_streams"] = root["maxStreams"].int(1, MAX_STREAMS)
    with doc.collecting():
        if root["taskSeries"].present:
            values["task_series"] = root["taskSeries"].int(0, MAX_TASK_SERIES)
    with doc.collecting():
        if root["spareRunDirs"].present:
            values["spare_run_dirs"] = root["spareRunDirs"].int(0, MAX_SPARE_RUN_DIRS)
    try:
        doc.errors.raise_if_any()
    except SpecError as exc:
        raise ConfigError.of(exc) from None
    return AgentConfig(**values, source=source)


def _metrics_addr(c: Cursor) -> str:
    if c.value is False:  # YAML reads a bare off as false
        return "off"
    text = c.str()
    if text == "off":
        return text
    from .metrics.exporter import parse_addr  # only where the field is set: it loads HTTP

    try:
        parse_addr(text)
    except ValueError as exc:
        raise c.error(f"metricsAddr: {exc}") from None
    return text


def _switch(c: Cursor, choices: tuple[str, ...]) -> str:
    """One of `choices`; YAML's bare off and on (false and true) read as the words."""
    if isinstance(c.value, bool):
        return "on" if c.value else "off"
    return c.str(choices)


def _group_name(c: Cursor) -> str:
    """A group name as the node's group database holds them (it need not exist yet)."""
    name = c.str()
    if name and (len(name) > 32 or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]*\$?", name)):
        raise c.error(f"adminGroup: {name!r} is not a group name")
    return name


def _absolute(c: Cursor) -> Path:
    text = c.str()
    if not text.startswith("/") or "\0" in text:
        raise c.error(f"{c.path[-1]}: expected an absolute path, got {text!r}")
    return Path(text)


def _size(c: Cursor) -> int:
    try:
        value = parse_size(c.value)
    except ValueError as exc:
        raise c.error(f"logCap: {exc}") from None
    if not 0 < value <= MAX_LOG_CAP:
        raise c.error(f"logCap: {value} is out of range 1..{MAX_LOG_CAP}")
    return value


def check_reserved(config: AgentConfig, cpus: Iterable[int]) -> None:
    """ConfigError, located at reservedCpus, when it names CPUs this node does not have."""
    present = sorted(set(cpus))
    missing = sorted(set(config.reserved_cpus) - set(present))
    if missing:
        what = (
            f"CPU {missing[0]} is" if len(missing) == 1 else f"CPUs {format_cpulist(missing)} are"
        )
        has = format_cpulist(present, empty="none")
        raise ConfigError(
            (),
            f"reservedCpus: {what} not on this node, which has CPUs {has}",
            config.reserved_at or config.source or "",
        )


def load_config(path: Path | None) -> AgentConfig:
    """`path`, else the default file when it exists, else an empty config."""
    if path is None:
        if not DEFAULT_CONFIG.exists():
            return AgentConfig()
        path = DEFAULT_CONFIG
    try:
        return _config(load_file(path), str(path))
    except SpecError as exc:
        raise ConfigError.of(exc) from None


__all__ = [
    "AgentConfig",
    "PoolConfig",
    "ConfigError",
    "DEFAULT_CONFIG",
    "check_reserved",
    "load_config",
    "parse_config",
    "format_path",
]
