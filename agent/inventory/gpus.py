"""NVIDIA GPUs through NVML (nvidia-ml-py): identity, memory, versions, NUMA node, NVLink peers.

Unsupported queries (NVLink on a PCIe card, MIG on a consumer GPU) are facts, not failures:
they leave the field empty and keep NVML's error name where the caller may want it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..node_model import Version, nvlink_islands
from .pci import pci_numa_node
from .sysfs import LIVE_ROOTS, Roots


@dataclass(frozen=True)
class GpuInfo:
    index: int
    uuid: str
    name: str
    memory_total: int
    memory_free: int
    memory_used: int
    compute_capability: Version
    pci_bus_id: str
    numa_node: int | None
    nvlink_links: dict[int, int] = field(
        default_factory=dict, hash=False
    )  # peer GPU -> active links
    nvlink_up: int = 0  # active links, to GPUs or NVSwitches
    nvlink_error: str | None = None  # e.g. NVMLError_NotSupported on a PCIe card
    mig_mode: bool | None = None  # None: not supported
    processes: int | None = None  # None: not supported


@dataclass(frozen=True)
class GpuInventory:
    available: bool
    reason: str | None = None
    driver_version: str | None = None
    cuda_driver_version: Version | None = None
    gpus: tuple[GpuInfo, ...] = ()

    def islands(self) -> dict[int, int]:
        return nvlink_islands({g.index: list(g.nvlink_links) for g in self.gpus})


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _bus(value) -> str:
    """NVML bus ids come as 00000000:18:00.0 (and in upper case); sysfs writes 0000:18:00.0."""
    domain, _, rest = _text(value).lower().partition(":")
    return f"{int(domain, 16):04x}:{rest}"


def _optional(nvml, call, *args):
    try:
        return call(*args), None
    except nvml.NVMLError as exc:
        return None, type(exc).__name__


def _nvlinks(nvml, handle) -> tuple[list[str], str | None]:
    """Bus ids at the far end of every active link, and the error of link 0 if NVLink is absent."""
    remotes, first_error = [], None
    for link in range(nvml.NVML_NVLINK_MAX_LINKS):
        state, error = _optional(nvml, nvml.nvmlDeviceGetNvLinkState, handle, link)
        if error:
            first_error = first_error or (error if link == 0 else None)
            continue
        if state == nvml.NVML_FEATURE_ENABLED:
            info, _ = _optional(nvml, nvml.nvmlDeviceGetNvLinkRemotePciInfo, handle, link)
            if info is not None:
                remotes.append(_bus(info.busId))
    return remotes, first_error


def _peer_links(remotes: dict[int, list[str]], by_bus: dict[str, int]) -> dict[int, dict[int, int]]:
    """GPU -> {peer GPU: links}. A link to a non-GPU (an NVSwitch) makes every GPU on that
    switch a peer, counted once per such link."""
    on_switch: dict[str, set[int]] = {}
    for gpu, buses in remotes.items():
        for bus in buses:
            if bus not in by_bus:
                on_switch.setdefault(bus, set()).add(gpu)
    links: dict[int, dict[int, int]] = {g: {} for g in remotes}
    for gpu, buses in remotes.items():
        for bus in buses:
            peers = {by_bus[bus]} if bus in by_bus else on_switch[bus] - {gpu}
            for peer in peers:
                links[gpu][peer] = links[gpu].get(peer, 0) + 1
    return links


def read_gpus(roots: Roots = LIVE_ROOTS) -> GpuInventory:
    # NVML can see no GPU that the kernel's nvidia driver has not bound; without it, the
    # daemon need not load pynvml at all (2.3 MB of its resident size, for nothing)
    if not (roots.sys / "bus/pci/drivers/nvidia").is_dir():
        return GpuInventory(False, f"no NVIDIA driver: {roots.sys}/bus/pci/drivers/nvidia absent")
    try:
        import pynvml as nvml
    except ImportError as exc:
        return GpuInventory(False, f"python module pynvml (nvidia-ml-py) not installed: {exc}")
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        return GpuInventory(False, f"{type(exc).__name__}: {exc}")
    try:
        return _read(nvml, roots)
    except nvml.NVMLError as exc:
        return GpuInventory(False, f"{type(exc).__name__}: {exc}")
    finally:
        nvml.nvmlShutdown()


def _read(nvml, roots: Roots) -> GpuInventory:
    cuda = nvml.nvmlSystemGetCudaDriverVersion()
    gpus, remotes = [], {}
    for index in range(nvml.nvmlDeviceGetCount()):
        h = nvml.nvmlDeviceGetHandleByIndex(index)
        mem = nvml.nvmlDeviceGetMemoryInfo(h)
        bus = _bus(nvml.nvmlDeviceGetPciInfo(h).busId)
        remotes[index], link_error = _nvlinks(nvml, h)
        mig, _ = _optional(nvml, nvml.nvmlDeviceGetMigMode, h)
        compute, _ = _optional(nvml, nvml.nvmlDeviceGetComputeRunningProcesses, h)
        graphics, _ = _optional(nvml, nvml.nvmlDeviceGetGraphicsRunningProcesses, h)
        procs = (
            None
            if compute is None and graphics is None
            else len({p.pid for p in (compute or []) + (graphics or [])})
        )
        gpus.append(
            GpuInfo(
                index=index,
                uuid=_text(nvml.nvmlDeviceGetUUID(h)),
                name=_text(nvml.nvmlDeviceGetName(h)),
                memory_total=mem.total,
                memory_free=mem.free,
                memory_used=mem.used,
                compute_capability=Version(*nvml.nvmlDeviceGetCudaComputeCapability(h)),
                pci_bus_id=bus,
                numa_node=pci_numa_node(roots, bus),
                nvlink_up=len(remotes[index]),
                nvlink_error=link_error,
                mig_mode=None if mig is None else bool(mig[0] == nvml.NVML_DEVICE_MIG_ENABLE),
                processes=procs,
            )
        )
    links = _peer_links(remotes, {g.pci_bus_id: g.index for g in gpus})
    gpus = [
        GpuInfo(**{**g.__dict__, "nvlink_links": dict(sorted(links[g.index].items()))})
        for g in gpus
    ]
    return GpuInventory(
        True,
        None,
        _text(nvml.nvmlSystemGetDriverVersion()),
        Version(cuda // 1000, cuda % 1000 // 10),
        tuple(gpus),
    )
