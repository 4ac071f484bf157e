"""The import layering: the pure scheduling core and the ground floor load nothing that
touches the kernel, the driver or the live node, so they run (and are tested, simulated and
embedded in the daemon) anywhere, without root and without the compiled extensions; and no
library package loads the benchmarks (the top floor, xhagent.bench).

Each check runs a fresh interpreter, because this test process has imported everything.
"""

import json
import pkgutil
import subprocess
import sys

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
