"""Inside the guest: a polled (IOPOLL) O_DIRECT read of the emulated NVMe disk returns
the bytes the harness wrote there, and the doctor reports what the guest can do."""

from pathlib import Path

import pytest

from xhagent.doctor.iopoll_probe import polled_read

pytestmark = pytest.mark.kernel


def test_nvme_queue_polls():
    assert Path("/sys/block/nvme0n1/queue/io_poll").read_text().strip() == "1"


@pytest.mark.parametrize("offset,length", [(0, 4096), (8192, 65536), ((1 << 20) - 4096, 8192)])
def test_polled_read_returns_the_written_bytes(nvme_device, nvme_pattern, offset, length):
    assert polled_read(str(nvme_device), length, offset) == nvme_pattern.expected(offset, length)


def test_polled_read_of_a_file_still_refused_in_guest(tmp_path):
    # The polling is the device's, not io_uring's: a tmpfs file cannot be polled.
    path = tmp_path / "f"
    path.write_bytes(b"x" * 4096)
    with pytest.raises(OSError):
        polled_read(str(path))


@pytest.fixture(scope="module")
def report(doctor_report):
    return doctor_report


def test_doctor_reports_iopoll_usable_on_nvme(report, run_xhagent):
    assert report["iopoll.nvme0n1"]["ok"], report["iopoll.nvme0n1"]
    assert report["iopoll.nvme0n1"]["io_poll"] == 1
    assert report["iopoll"]["ok"] and "nvme0n1" in report["iopoll"]["devices"]
    assert run_xhagent("doctor", "--require", "iopoll").returncode == 0


def test_doctor_reports_full_cgroup2(report):
    assert report["cgroup.mode"]["mode"] == "unified"
    assert report["cgroup.controllers"]["ok"], report["cgroup.controllers"]
    for name in ("cgroup.create", "cgroup.freeze", "cgroup.kill", "ebpf.tp_btf_sched_switch"):
        assert report[name]["ok"], (name, report[name])
