"""The agent config's inventory part: node labels and CPUs reserved for the system.

    # /etc/xhagent/agent.yaml
    nodeName: gpu-07            # default: the host name
    labels: {rack: r12, zone: z1, pool: training}
    reservedCpus: "0,64"        # kernel cpu-list syntax, or a list of ints

Other top-level keys belong to other parts of the agent and are left alone here.
"""
from __future__ import annotations

import socket
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ..spec import SpecError, read_text
from .model import Labels, ModelError, _mark_of, _spec_checks, format_path
from .sysfs import parse_cpulist

DEFAULT_CONFIG = Path("/etc/xhagent/agent.yaml")


class ConfigError(ModelError):
    pass


@dataclass(frozen=True)
class AgentConfig:
    node_name: str = field(default_factory=socket.gethostname)
    labels: Labels = field(default_factory=Labels, hash=False)
    reserved_cpus: tuple[int, ...] = ()
    source: str | None = None


def _reserved(raw, path: tuple) -> tuple[int, ...]:
    if isinstance(raw, int) and not isinstance(raw, bool):
        return (raw,)
    if isinstance(raw, list) and all(isinstance(c, int) and not isinstance(c, bool) for c in raw):
        return tuple(sorted(set(raw)))
    if isinstance(raw, str):
        try:
            return tuple(sorted(set(parse_cpulist(raw))))
        except ValueError:
            pass
    raise ModelError(path, f"expected a cpu list such as \"0,64\" or \"0-1\" or [0, 64], got {raw!r}")


def parse_config(text: str, source: str) -> AgentConfig:
    try:
        _spec_checks(text, source)
    except ModelError as exc:
        raise ConfigError(exc.path, exc.message, exc.where) from None
    try:
        tree = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text) if tree is not None else {}
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        raise ConfigError((), f"YAML syntax: {exc.problem or exc.context}",
                          f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source) from None
    try:
        if not isinstance(data, dict):
            raise ModelError((), "expected a mapping with labels, reservedCpus, nodeName")
        name = data.get("nodeName", socket.gethostname())
        if not isinstance(name, str) or not name:
            raise ModelError(("nodeName",), f"expected a non-empty string, got {name!r}")
        return AgentConfig(name, Labels._parse(data.get("labels"), ("labels",)),
                           _reserved(data.get("reservedCpus", []), ("reservedCpus",)), source)
    except ModelError as exc:
        mark = _mark_of(tree, exc.path) if tree is not None else None
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        raise ConfigError(exc.path, exc.message, where) from None


def load_config(path: Path | None) -> AgentConfig:
    """`path`, else the default file when it exists, else an empty config."""
    if path is None:
        if not DEFAULT_CONFIG.exists():
            return AgentConfig()
        path = DEFAULT_CONFIG
    try:
        text = read_text(path)  # bounded, UTF-8, regular files and FIFOs only
    except SpecError as exc:
        raise ConfigError((), exc.message, exc.file) from None
    return parse_config(text, str(path))


__all__ = ["AgentConfig", "ConfigError", "DEFAULT_CONFIG", "load_config", "parse_config", "format_path"]
