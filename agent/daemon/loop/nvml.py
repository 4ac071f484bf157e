"""What NVML says of the node's GPUs, for the loop: each GPU's utilisation (the migration
controller's load) and the GPU memory each process uses (the dwps memory model).

NVML is tried once, and never again once it failed (`error` says why): without the NVIDIA
driver bound it sees nothing, and pynvml would cost resident memory for nothing. A GPU is
found by its UUID, as the inventory names it; one NVML does not see is left out of the
answers, and its callers fall back on what the agent booked.
"""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger("xhagent")


class Nvml:
    def __init__(self, sys_root: Path = Path("/sys")):
        self.sys_root = sys_root
        self.error: str | None = None
        self._nvml = None

    def utilisation(self, gpus) -> dict[int, float]:
        """Model GPU index -> utilisation (0..1) of those NVML sees by UUID."""
        return self._each(gpus, lambda nvml, h: nvml.nvmlDeviceGetUtilizationRates(h).gpu / 100)

    def process_memory(self, gpus) -> dict[int, dict[int, int]]:
        """Model GPU index -> {pid: bytes of its memory the process uses}, for the compute
        processes NVML lists on each GPU it sees (one whose use it cannot tell is left out)."""

        def used(nvml, handle) -> dict[int, int]:
            out: dict[int, int] = {}
            for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if isinstance(p.usedGpuMemory, int):  # None: not available (e.g. under MIG)
                    out[p.pid] = out.get(p.pid, 0) + p.usedGpuMemory
            return out

        return self._each(gpus, used)

    def _each(self, gpus, read) -> dict:
        if not gpus or self.error is not None:
            return {}
        if self._nvml is None:
            self._nvml = self._init()
            if self._nvml is None:
                return {}
        nvml, out = self._nvml, {}
        for g in gpus:
            try:
                out[g.index] = read(nvml, nvml.nvmlDeviceGetHandleByUUID(g.uuid))
            except Exception as exc:  # NVMLError_*: that GPU is left to what the agent booked
                log.debug("NVML on GPU %s: %s", g.uuid, exc)
        if not out:
            self.error = self.error or "NVML sees none of the node's GPUs"
        return out

    def _init(self):
        if not (self.sys_root / "bus/pci/drivers/nvidia").is_dir():
            self.error = f"no NVIDIA driver: {self.sys_root}/bus/pci/drivers/nvidia absent"
            return None
        try:
            import pynvml as nvml

            nvml.nvmlInit()
        except Exception as exc:  # ImportError, NVMLError_LibraryNotFound, ...
            self.error = f"NVML: {type(exc).__name__}: {exc}"
            return None
        return nvml
