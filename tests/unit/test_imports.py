"""The import layering: the pure scheduling core and the ground floor load nothing that
touches the kernel, the driver or the live node, so they run (and are tested, simulated and
embedded in the daemon) anywhere, without root and without the compiled extensions.

Each check runs a fresh interpreter, because this test process has imported everything.
"""

import json
import subprocess
import sys

import pytest

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


def loaded_after(*modules: str, walk: tuple[str, ...] = ()) -> list[str]:
    """The modules a fresh interpreter holds after importing `modules` and every module of
    the packages in `walk`."""
    code = f"""
import importlib, json, pkgutil, sys
for name in {list(modules)!r}:
    importlib.import_module(name)
for name in {list(walk)!r}:
    package = importlib.import_module(name)
    for info in pkgutil.walk_packages(package.__path__, name + "."):
        importlib.import_module(info.name)
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
    # Its CLI and bench included: they use the library, the ground floor and the io engine
    # (batched stats reads), so `xhagent.cgroups` is usable on its own.
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
    )
    assert [
        n for n in loaded if n in forbidden or n.startswith(tuple(f + "." for f in forbidden))
    ] == []
    assert "xhagent.cgroups.cli" in loaded and "xhagent.cgroups.bench" in loaded
