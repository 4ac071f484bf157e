"""tools/vmtest on a real emulated guest that does not finish: past --timeout it is killed,
and first each vCPU is described from QEMU's monitor, by the guest's own kernel symbols
(here: two idle CPUs, halted in the idle loop, with the idle path on their stacks). Stopped
by a signal, or by its parent's death, vmtest leaves no process of its VM behind."""

import os
import re
import shlex
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

pytestmark = pytest.mark.host

REPO = Path(__file__).resolve().parents[2]


def test_a_guest_past_its_timeout_has_its_vcpus_described_before_it_is_killed():
    proc = subprocess.run(
        [str(REPO / "tools" / "vmtest"), "--timeout", "60", "--", "sleep", "600"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 124, proc.stderr[-2000:]
    assert "TIMEOUT: the guest did not finish within 60s" in proc.stderr
    described = re.findall(r"^vmtest: vCPU (\d): (\S+) \(([^)]*)\)(.*)$", proc.stderr, re.M)
    # two rounds, a line per vCPU each
    assert [cpu for cpu, *_ in described] == ["0", "1", "0", "1"], proc.stderr[-2000:]
    for _, where, state, stack in described:
        # an idle guest: named symbols (its kallsyms came back), interrupts on
        assert re.fullmatch(r"[A-Za-z_][\w.]*\+0x[0-9a-f]+", where), where
        assert state.startswith("interrupts on")
        if "in user space" not in state:  # in the kernel: its stack read and named
            assert stack.startswith("; kernel text on its stack: "), stack


# A VM of one test is told from any other by a mark in the environment, which vmtest hands
# down to vng, virtme-run and qemu.
MARK = "XHAGENT_VMTEST_MARK"


def marked(mark: str) -> dict[int, str]:
    """pid -> command name of every process whose environment holds the mark."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if f"{MARK}={mark}".encode() in (entry / "environ").read_bytes().split(b"\0"):
                found[int(entry.name)] = (entry / "comm").read_text().strip()
        except OSError:  # gone meanwhile
            pass
    return found


def wait_for(predicate, timeout: float, step: float = 0.1):
    deadline = time.monotonic() + timeout
    while not (value := predicate()) and time.monotonic() < deadline:
        time.sleep(step)
    return value


@pytest.fixture
def vm_mark():
    mark = uuid.uuid4().hex
    yield mark
    for pid in marked(mark):  # whatever a failed test left: only this test's processes
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def qemus(mark: str) -> list[int]:
    return [pid for pid, comm in marked(mark).items() if comm.startswith("qemu-system")]


def start_marked(argv: list[str], mark: str) -> subprocess.Popen:
    """`argv` started with the mark, once its qemu runs (killed early: no need to boot)."""
    proc = subprocess.Popen(argv, env={**os.environ, MARK: mark}, stderr=subprocess.PIPE, text=True)
    assert wait_for(lambda: qemus(mark), 60), "no qemu started within 60 s"
    return proc


VMTEST = [str(REPO / "tools" / "vmtest"), "--timeout", "300", "--", "sleep", "600"]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_to_vmtest_takes_its_vm_down(vm_mark, signum):
    proc = start_marked(VMTEST, vm_mark)
    proc.send_signal(signum)
    started = time.monotonic()
    assert proc.wait(timeout=20) == 128 + signum
    _, err = proc.communicate()
    assert f"vmtest: stopped by {signal.Signals(signum).name}; the VM is stopped" in err
    left = wait_for(lambda: not marked(vm_mark), 5) or marked(vm_mark)
    assert left is True, f"left running {time.monotonic() - started:.1f}s after: {left}"


def test_vmtest_whose_parent_dies_takes_its_vm_down(vm_mark):
    # the parent is a shell that waits for vmtest (`; :` keeps it from exec-ing it)
    parent = start_marked(["sh", "-c", f"{shlex.join(VMTEST)}; :"], vm_mark)
    parent.kill()
    parent.wait()
    started = time.monotonic()
    left = wait_for(lambda: not marked(vm_mark), 20) or marked(vm_mark)
    assert left is True, f"left running {time.monotonic() - started:.1f}s after: {left}"


def test_vmtest_killed_outright_has_its_vm_taken_down_by_its_watchdog(vm_mark):
    proc = start_marked(VMTEST, vm_mark)
    proc.kill()  # no handler runs: the watchdog sees vmtest's end of its pipe close
    proc.wait()
    started = time.monotonic()
    left = wait_for(lambda: not marked(vm_mark), 20) or marked(vm_mark)
    assert left is True, f"left running {time.monotonic() - started:.1f}s after: {left}"
