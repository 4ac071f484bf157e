"""Inside the guest: IOPOLL O_DIRECT reads and writes on the emulated NVMe disk through the
engine, data verified, on the polled ring itself (no fallback), and `bench io` on it."""

import json
import os
import random

import pytest

from xhagent.io import AlignedBuffer, DirectFile

pytestmark = pytest.mark.kernel
BLOCK = 4096
SCRATCH = 40 << 20  # writes stay above 32 MiB: the pattern lives in the first MiB


def test_polled_reads_return_the_pattern(nvme_device, nvme_pattern):
    offsets = [o * BLOCK for o in random.Random(4).sample(range((1 << 20) // BLOCK), 128)]
    with DirectFile(str(nvme_device)) as f, AlignedBuffer(len(offsets) * BLOCK) as buf:
        assert f.device_polls and f.polled  # chosen by queue/io_poll, not forced
        f.read(offsets, BLOCK, buf.view, depth=32).check()
        for i, o in enumerate(offsets):
            assert bytes(buf.view[i * BLOCK : (i + 1) * BLOCK]) == nvme_pattern.expected(o, BLOCK)
        assert f.stats["polled_ops"] == 128 and f.stats["fallbacks"] == 0 and f.polled


def test_polled_writes_then_polled_reads(nvme_device):
    payload = os.urandom(16 * BLOCK)
    offsets = [SCRATCH + i * BLOCK for i in range(16)]
    with DirectFile(str(nvme_device), write=True) as f, AlignedBuffer(16 * BLOCK) as buf:
        buf.view[:] = payload
        f.write(offsets, BLOCK, buf.view, depth=8).check()
        buf.view[:] = bytes(16 * BLOCK)
        f.read(list(reversed(offsets)), BLOCK, buf.view, depth=16).check()
        back = b"".join(bytes(buf.view[i * BLOCK : (i + 1) * BLOCK]) for i in reversed(range(16)))
        assert back == payload
        assert f.stats["polled_ops"] == 32 and f.stats["fallbacks"] == 0


def test_bench_io_runs_polled_cases_on_nvme(nvme_device, run_xhagent):
    res = run_xhagent(
        "bench",
        "io",
        "--json",
        "--file",
        str(nvme_device),
        "--size",
        "8M",
        "--seconds",
        "0.2",
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    for case in (
        "direct_pread",
        "direct_engine_qd1",
        "direct_engine_qd32",
        "direct_iopoll_qd1",
        "direct_iopoll_qd32",
    ):
        assert report["cases"][case]["ops_per_s"] > 0, case
    assert "direct_iopoll_qd1_vs_interrupt_qd1_p50_ratio" in report["ratios"]
    assert "fallbacks 0" in report["notes"]["iopoll"]
