"""The import layering: the pure scheduling core and the ground floor load nothing that
touches the kernel, the driver or the live node, so they run (and are tested, simulated and
embedded in the daemon) anywhere, without root and without the compiled extensions; and no
library package loads the benchmarks (the top floor, xhagent.bench).

Each check runs a fresh interpreter, because this test process has imported everything.
"""

import ast
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import xhagent

# The ground floor: modules every package may import, which import nothing of the agent's
# packages but one another (and plain libraries such as yaml and click).
GROUND_FLOOR = (
    "xhagent.quantity",
    "xhagent.cpulist",
    "xhagent.errors",
    "xhagent.inputs",
    "xhagent.spec",
    "xhagent.signals",
    "xhagent.heap",
    "xhagent.cliparams",
    "xhagent.node_model",
    "xhagent.outputs",
    "xhagent.config",
    "xhagent.fields",
)

# What counts as kernel-facing (or node-facing), and why the core must not load it.
KERNEL_FACING = {
    "xhagent.doctor": "probes the live node: sets up rings, loads BPF programs, creates cgroups",
    "xhagent.bpf": "libbpf binding: loads and attaches programs, reads maps",
    "xhagent._bpf": "compiled cffi extension over libbpf; absent where it was not built",
    "xhagent._uring": "compiled cffi extension over liburing; absent where it was not built",
    "xhagent.io": "io_uring, O_DIRECT and polled I/O on real devices",
    "xhagent.cgroups": "the cgroup library writes /sys/fs/cgroup; the core decides, the "
    "executor applies",
    "xhagent.inventory": "discovery reads this machine's sysfs, procfs and NVML; the core takes "
    "the model (xhagent.node_model) instead",
    "xhagent.trace": "the recorder attaches BPF programs; the format reader imports xhagent.bpf",
    "xhagent.mountinfo": "reads this machine's /proc/self/mountinfo",
    "pynvml": "talks to the NVIDIA driver",
    "cffi": "only the compiled extensions need it",
}

CORE = ("xhagent.policy", "xhagent.sched", "xhagent.spec", "xhagent.quantity")

# The top floor: every benchmark and what drives them. It may import any package; no library
# package imports it, only the root CLI (lazily, when `xhagent bench NAME` runs) and tests.
TOP_FLOOR = "xhagent.bench"


def loaded_after(
    *modules: str, walk: tuple[str, ...] = (), skip: tuple[str, ...] = ()
) -> list[str]:
    """The modules a fresh interpreter holds after importing `modules` and every module of
    the packages in `walk`, but for the modules and packages in `skip` (never imported, so
    not even a package's __init__ is run)."""
    code = f"""
import importlib, json, pkgutil, sys
skip = {list(skip)!r}
def skipped(name):
    return any(name == s or name.startswith(s + ".") for s in skip)
def walk(package):
    for info in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
        if not skipped(info.name):
            module = importlib.import_module(info.name)
            if info.ispkg:
                walk(module)
for name in {list(modules)!r}:
    importlib.import_module(name)
for name in {list(walk)!r}:
    walk(importlib.import_module(name))
print(json.dumps(sorted(sys.modules)))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def kernel_facing(names: list[str]) -> list[str]:
    return [n for n in names if any(n == k or n.startswith(k + ".") for k in KERNEL_FACING)]


def test_importing_the_core_loads_nothing_kernel_facing():
    assert kernel_facing(loaded_after(*CORE)) == []


def test_every_module_of_the_core_loads_nothing_kernel_facing():
    # Their CLIs included: what they need of discovery or the kernel they import when run.
    assert kernel_facing(loaded_after(walk=("xhagent.policy", "xhagent.sched"))) == []


@pytest.mark.parametrize("module", GROUND_FLOOR)
def test_the_ground_floor_imports_only_the_ground_floor(module):
    agent = [n for n in loaded_after(module) if n.startswith("xhagent.")]
    assert set(agent) <= set(GROUND_FLOOR), sorted(set(agent) - set(GROUND_FLOOR))


def test_the_check_sees_a_kernel_facing_import():
    # The probe itself: importing the doctor is caught, through its package prefix.
    assert "xhagent.doctor" in kernel_facing(loaded_after("xhagent.doctor.report"))


def test_the_cgroup_library_imports_no_doctor_discovery_or_cli():
    # Its CLI included: it uses the library, the ground floor and the io engine (batched
    # stats reads), so `xhagent.cgroups` is usable on its own.
    loaded = loaded_after(walk=("xhagent.cgroups",))
    forbidden = (
        "xhagent.doctor",
        "xhagent.inventory",
        "xhagent.cli",
        "xhagent.policy",
        "xhagent.sched",
        "xhagent.trace",
        "xhagent.bpf",
        "xhagent.daemon",
        TOP_FLOOR,
    )
    assert [
        n for n in loaded if n in forbidden or n.startswith(tuple(f + "." for f in forbidden))
    ] == []
    assert "xhagent.cgroups.cli" in loaded


def top_floor(names: list[str]) -> list[str]:
    return [n for n in names if n == TOP_FLOOR or n.startswith(TOP_FLOOR + ".")]


def test_no_library_module_imports_the_benchmarks():
    # Every module of every package but the top floor and the root CLI (whose BENCHMARKS
    # table names the benchmarks' modules, imported only when one runs); xhagent.cgroups
    # apart, as its folder is mapped into the namespace on its own.
    skip = (TOP_FLOOR, "xhagent.cli")
    loaded = loaded_after(walk=("xhagent", "xhagent.cgroups"), skip=skip)
    # the walk reached every module and package of the top level, and into the packages
    top = {f"xhagent.{m.name}" for m in pkgutil.iter_modules(xhagent.__path__)} - set(skip)
    assert top | {"xhagent.cgroups", "xhagent.cgroups.cli"} <= set(loaded)
    assert top_floor(loaded) == []


def test_the_check_sees_an_import_of_the_benchmarks():
    # The probe itself: a benchmark module is caught, and the package through its prefix.
    assert "xhagent.bench" in top_floor(loaded_after("xhagent.bench.sched"))
    # and skipping the top floor in the walk hides no import of it that a module makes
    skip = (TOP_FLOOR, "xhagent.cli")
    walked = loaded_after("xhagent.bench.sched", walk=("xhagent.sched",), skip=skip)
    assert "xhagent.bench.sched" in top_floor(walked)


# -- the daemon's rooms ---------------------------------------------------------------------------

DAEMON = Path(__file__).resolve().parents[2] / "agent" / "daemon"
# room -> the rooms (and top-floor modules) of the daemon it must not load
DAEMON_RULES = {
    "xhagent.daemon.store": ("api", "loop", "exec", "policies", "daemon", "run", "metrics"),
    "xhagent.daemon.exec": ("api", "loop", "policies", "daemon", "run", "metrics"),
    "xhagent.daemon.policies": ("api", "loop", "exec", "daemon", "run", "metrics"),
    "xhagent.daemon.loop": ("api", "policies", "daemon", "run", "metrics"),
    "xhagent.daemon.api": ("daemon", "run", "metrics"),
}


def daemon_rooms(names: list[str], rooms: tuple[str, ...]) -> list[str]:
    prefixes = tuple(f"xhagent.daemon.{r}" for r in rooms)
    return [n for n in names if n in prefixes or n.startswith(tuple(p + "." for p in prefixes))]


@pytest.mark.parametrize("room", sorted(DAEMON_RULES))
def test_each_room_of_the_daemon_loads_only_the_rooms_below_it(room):
    # every module of the room imported, its function-local imports aside (the static
    # check below sees those)
    loaded = loaded_after(walk=(room,))
    assert daemon_rooms(loaded, DAEMON_RULES[room]) == []


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """module -> the modules of `package` it imports anywhere in its text (function-local
    imports included), read from the source without running it."""
    graph: dict[str, set[str]] = {}
    for path in sorted(root.rglob("*.py")):
        if path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
            continue
        parts = path.relative_to(root).with_suffix("").parts
        is_pkg = parts[-1] == "__init__"
        name = ".".join((package, *(parts[:-1] if is_pkg else parts)))
        here = name.split(".") if is_pkg else name.split(".")[:-1]
        edges = graph.setdefault(name, set())
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = here[: len(here) - (node.level - 1)] if node.level else []
                target = ".".join([*base, *(node.module.split(".") if node.module else [])])
                # a submodule of target, else a name in it (resolved by _module below)
                edges.update(f"{target}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.Import):
                edges.update(a.name for a in node.names)
    modules = set(graph)
    return {
        m: {_module(t, modules) for t in targets if _module(t, modules) not in (None, m)}
        for m, targets in graph.items()
    }


def _module(name: str, modules: set[str]) -> str | None:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each strongly connected set of more than one module (an import circle), sorted. A
    package is its __init__: importing any of its modules runs it first."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def upward(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Edges that break a room's rule, function-local imports included."""
    bad = []
    for m, targets in graph.items():
        for room, forbidden in DAEMON_RULES.items():
            if m == room or m.startswith(room + "."):
                bad += [(m, t) for t in daemon_rooms(sorted(targets), forbidden)]
    return sorted(bad)


def test_the_daemons_files_import_in_no_circle_and_never_back_up():
    graph = import_graph(DAEMON, "xhagent.daemon")
    assert "xhagent.daemon.loop.scheduler" in graph and graph["xhagent.daemon.daemon"]
    assert cycles(graph) == []
    assert upward(graph) == []


def test_the_room_checks_see_a_circle_and_an_arrow_back_up():
    # The probe itself: one added import from the store up into the loop is both.
    graph = import_graph(DAEMON, "xhagent.daemon")
    graph["xhagent.daemon.store.store"].add("xhagent.daemon.loop.scheduler")
    assert any("xhagent.daemon.store.store" in c for c in cycles(graph))
    assert upward(graph) == [("xhagent.daemon.store.store", "xhagent.daemon.loop.scheduler")]


def test_the_graph_sees_a_function_local_import(tmp_path):
    # a module whose only import of another room sits inside a function
    (tmp_path / "store").mkdir()
    (tmp_path / "loop").mkdir()
    for pkg in ("", "store/", "loop/"):
        (tmp_path / f"{pkg}__init__.py").write_text("")
    (tmp_path / "loop" / "scheduler.py").write_text("")
    (tmp_path / "store" / "store.py").write_text(
        "def late():\n    from ..loop import scheduler\n    return scheduler\n"
    )
    graph = import_graph(tmp_path, "xhagent.daemon")
    assert "xhagent.daemon.loop.scheduler" in graph["xhagent.daemon.store.store"]
    assert upward(graph) == [("xhagent.daemon.store.store", "xhagent.daemon.loop.scheduler")]
