"""On a machine with an NVIDIA GPU: the doctor's NVML item agrees with nvidia-smi."""

import ctypes.util
import shutil
import subprocess

import pytest

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def smi():
    if not ctypes.util.find_library("nvidia-ml") or not shutil.which("nvidia-smi"):
        pytest.skip("no NVIDIA GPU driver (libnvidia-ml, nvidia-smi) on this machine")
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return {"gpus": len(out), "driver": out[0]}


def test_doctor_nvml_matches_nvidia_smi(smi, doctor_report):
    report = doctor_report
    assert report["nvml"]["ok"], report["nvml"]
    assert report["nvml"]["gpus"] == smi["gpus"]
    assert report["nvml"]["driver"] == smi["driver"]
