"""tools/vmtest on a real emulated guest that does not finish: past --timeout it is killed,
and first each vCPU is described from QEMU's monitor, by the guest's own kernel symbols
(here: two idle CPUs, halted in the idle loop, with the idle path on their stacks)."""

import re
import subprocess
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
