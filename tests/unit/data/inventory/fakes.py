"""Recorded-tree builders for the inventory tests: written on demand, not committed file by file.

server(root): a 2-socket NUMA server, 4 cores x 2 SMT threads per socket (Linux numbering:
  socket 0 = CPUs 0-3 + 8-11, socket 1 = 4-7 + 12-15), L1/L2 per core, one L3 per socket,
  SLIT 10/21, an NVMe disk with poll queues on node 1, a SATA disk on node 0, an empty loop0.
gpu_box(root): the same server with 8 NVIDIA GPUs on PCIe (0-3 on node 0, 4-7 on node 1).
tpu_chips(root, ...): Google TPU chips added to a tree, as the accel class (TPU v4+, /dev/accelN)
  or bound to vfio-pci (TPU v2/v3, /dev/vfio/GROUP); npu(root): a generic accel-class device.
FakeNvml: pynvml functions with values and errors as NVML returns them.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pynvml

from xhagent.cpulist import parse_cpulist

SOCKETS, CORES, SMT = 2, 4, 2
NCPU = SOCKETS * CORES * SMT
GPU_BUS = [f"0000:{b:02x}:00.0" for b in (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)]


def put(path: Path, value) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{value}\n")


def cpu_place(cpu: int) -> tuple[int, int, int]:
    """(socket, core, thread) of a logical CPU."""
    thread, rest = divmod(cpu, SOCKETS * CORES)
    socket, core = divmod(rest, CORES)
    return socket, core, thread


def cpus_of(socket: int) -> list[int]:
    return [c for c in range(NCPU) if cpu_place(c)[0] == socket]


def cl(cpus) -> str:
    return ",".join(map(str, sorted(cpus)))


def server(root: Path, online: str = f"0-{NCPU - 1}") -> tuple[Path, Path]:
    sys_, proc = root / "sys", root / "proc"
    base = sys_ / "devices/system/cpu"
    put(base / "online", online)
    put(base / "present", f"0-{NCPU - 1}")
    up = set(parse_cpulist(online))
    for cpu in range(NCPU):
        socket, core, _ = cpu_place(cpu)
        # The kernel lists online siblings only.
        siblings = [c for c in range(NCPU) if cpu_place(c)[:2] == (socket, core) and c in up]
        d = base / f"cpu{cpu}"
        (d / f"node{socket}").mkdir(parents=True)
        t = d / "topology"
        put(t / "physical_package_id", socket)
        put(t / "die_id", 0)
        put(t / "core_id", core)
        put(t / "thread_siblings_list", cl(siblings))
        caches = [
            (1, "Data", "48K", socket * CORES + core, siblings),
            (1, "Instruction", "32K", socket * CORES + core, siblings),
            (2, "Unified", "2048K", socket * CORES + core, siblings),
            (3, "Unified", "32768K", socket, cpus_of(socket)),
        ]
        for i, (level, kind, size, cid, shared) in enumerate(caches):
            put(d / f"cache/index{i}/level", level)
            put(d / f"cache/index{i}/type", kind)
            put(d / f"cache/index{i}/size", size)
            put(d / f"cache/index{i}/id", cid)
            put(d / f"cache/index{i}/shared_cpu_list", cl(shared))
    node = sys_ / "devices/system/node"
    put(node / "online", f"0-{SOCKETS - 1}")
    for n in range(SOCKETS):
        put(node / f"node{n}/cpulist", cl(cpus_of(n)))
        put(node / f"node{n}/distance", " ".join("10" if m == n else "21" for m in range(SOCKETS)))
        put(
            node / f"node{n}/meminfo",
            f"Node {n} MemTotal:       {64 << 20} kB\nNode {n} MemFree:        {60 << 20} kB\n"
            f"Node {n} MemUsed:         {4 << 20} kB",
        )
    put(
        proc / "meminfo",
        f"MemTotal:       {128 << 20} kB\nMemFree:        {120 << 20} kB\n"
        f"MemAvailable:   {124 << 20} kB\nHugePages_Total:       0",
    )
    put(
        proc / "self/status",
        f"Name:\txhagent\nCpus_allowed:\tffff\nCpus_allowed_list:\t0-{NCPU - 1}",
    )
    for size, total, free in (("2048kB", 512, 500), ("1048576kB", 4, 4)):
        put(sys_ / f"kernel/mm/hugepages/hugepages-{size}/nr_hugepages", total)
        put(sys_ / f"kernel/mm/hugepages/hugepages-{size}/free_hugepages", free)
    blk = sys_ / "block"
    for name, dev, size, rot, poll, sched, lbs, numa in (
        ("loop0", "7:0", 0, 0, 0, "none", 512, None),
        ("nvme0n1", "259:0", 7501476528, 0, 1, "[none] mq-deadline", 4096, 1),
        ("sda", "8:0", 3907029168, 1, 0, "none [mq-deadline] bfq", 512, 0),
    ):
        put(blk / name / "dev", dev)
        put(blk / name / "size", size)
        put(blk / name / "queue/rotational", rot)
        put(blk / name / "queue/io_poll", poll)
        put(blk / name / "queue/scheduler", sched)
        put(blk / name / "queue/logical_block_size", lbs)
        if numa is not None:
            put(blk / name / "device/numa_node", numa)
    put(sys_ / "module/nvme/parameters/poll_queues", 4)
    pci(sys_, "0000:00:00.0", 0x060000, 0x8086, 0x09A2, 0, None, None)
    pci(sys_, "0000:5e:00.0", 0x010802, 0x144D, 0xA824, 1, "nvme", ("16.0 GT/s PCIe", 4))
    return sys_, proc


def pci(
    sys_: Path, addr: str, klass: int, vendor: int, device: int, numa: int, driver, link
) -> None:
    d = sys_ / "bus/pci/devices" / addr
    put(d / "class", f"0x{klass:06x}")
    put(d / "vendor", f"0x{vendor:04x}")
    put(d / "device", f"0x{device:04x}")
    put(d / "numa_node", numa)
    if driver:
        (sys_ / "bus/pci/drivers" / driver).mkdir(parents=True, exist_ok=True)
        os.symlink(sys_ / "bus/pci/drivers" / driver, d / "driver")
    if link:
        for prefix in ("current", "max"):
            put(d / f"{prefix}_link_speed", link[0])
            put(d / f"{prefix}_link_width", link[1])


def gpu_box(root: Path) -> tuple[Path, Path]:
    sys_, proc = server(root)
    for i, addr in enumerate(GPU_BUS):
        pci(sys_, addr, 0x030200, 0x10DE, 0x2330, i // 4, "nvidia", ("32.0 GT/s PCIe", 16))
    return sys_, proc


TPU_BUS = [f"0000:{b:02x}:00.0" for b in (0x05, 0x06, 0x85, 0x86)]


def tpu_chips(
    root: Path, device=0x005E, klass=0x088000, count=4, vfio=False, first_minor=0
) -> list[str]:
    """`count` Google TPU chips (vendor 0x1ae0), half on each NUMA node. As the accel class:
    /sys/class/accel/accelN -> its PCI function, node /dev/accelN (Google's driver). With
    `vfio`: driver vfio-pci, an IOMMU group per chip and /dev/vfio/GROUP, no accel class."""
    sys_, dev = root / "sys", root / "dev"
    for i, addr in enumerate(TPU_BUS[:count]):
        numa = i * 2 // count
        pci(sys_, addr, klass, 0x1AE0, device, numa, "vfio-pci" if vfio else "accel", None)
        d = sys_ / "bus/pci/devices" / addr
        if vfio:
            group = sys_ / f"kernel/iommu_groups/{12 + i}"
            group.mkdir(parents=True)
            os.symlink(group, d / "iommu_group")
            put(dev / f"vfio/{12 + i}", "")
            put(dev / "vfio/vfio", "")
        else:
            name = f"accel{first_minor + i}"
            (sys_ / "class/accel" / name).mkdir(parents=True)
            os.symlink(d, sys_ / "class/accel" / name / "device")
            put(dev / name, "")
    return TPU_BUS[:count]


def npu(root: Path, addr="0000:00:0b.0", minor=0) -> None:
    """An Intel NPU (8086:7d1d, class 0x1200, driver intel_vpu) laid out as the kernel does:
    the function under /sys/devices, bus/pci/devices and class/accel/accelN are relative
    links to it, the node is /dev/accel/accelN."""
    sys_ = root / "sys"
    real = sys_ / "devices/pci0000:00" / addr
    put(real / "vendor", "0x8086")
    put(real / "device", "0x7d1d")
    put(real / "class", "0x120000")
    put(real / "numa_node", -1)
    (sys_ / "bus/pci/drivers/intel_vpu").mkdir(parents=True, exist_ok=True)
    os.symlink("../../../bus/pci/drivers/intel_vpu", real / "driver")
    (real / f"accel/accel{minor}").mkdir(parents=True)
    os.symlink(f"../../../{addr}", real / f"accel/accel{minor}/device")
    (sys_ / "bus/pci/devices").mkdir(parents=True, exist_ok=True)
    os.symlink(f"../../../devices/pci0000:00/{addr}", sys_ / "bus/pci/devices" / addr)
    (sys_ / "class/accel").mkdir(parents=True, exist_ok=True)
    os.symlink(
        f"../../devices/pci0000:00/{addr}/accel/accel{minor}", sys_ / f"class/accel/accel{minor}"
    )
    put(root / f"dev/accel/accel{minor}", "")


def err(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(
        code
    )  # NVMLError.__new__ picks the subclass, e.g. NVMLError_NotSupported


class FakeNvml:
    """Installs itself over pynvml's functions (monkeypatch). `islands`: lists of GPU indices
    fully meshed over NVLink with `links_per_peer` links each; None: PCIe cards without NVLink."""

    def __init__(
        self,
        monkeypatch,
        count=8,
        islands=((0, 1, 2, 3), (4, 5, 6, 7)),
        links_per_peer=2,
        name="NVIDIA H100 80GB HBM3",
        init_error: int | None = None,
    ):
        self.count, self.name, self.init_error = count, name, init_error
        self.links: dict[int, list[str]] = {i: [] for i in range(count)}
        for island in islands or ():
            for g in island:
                for p in island:
                    if p != g:
                        self.links[g] += [
                            GPU_BUS[p].replace("0000:", "00000000:").upper()
                        ] * links_per_peer
        self.nvlink = islands is not None
        for attr in dir(self):
            if attr.startswith("nvml"):
                monkeypatch.setattr(pynvml, attr, getattr(self, attr))

    def nvmlInit(self):
        if self.init_error is not None:
            raise err(self.init_error)

    def nvmlShutdown(self):
        pass

    def nvmlSystemGetDriverVersion(self):
        return "550.54.15"

    def nvmlSystemGetCudaDriverVersion(self):
        return 12040

    def nvmlDeviceGetCount(self):
        return self.count

    def nvmlDeviceGetHandleByIndex(self, i):
        if not 0 <= i < self.count:
            raise err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return SimpleNamespace(index=i)

    def nvmlDeviceGetUUID(self, h):
        return f"GPU-{h.index:08x}-1b2a-4c3d-8e9f-0a1b2c3d4e5f"

    def nvmlDeviceGetName(self, h):
        return self.name

    def nvmlDeviceGetMemoryInfo(self, h):
        total, used = 85520809984, (1 + h.index) << 30
        return SimpleNamespace(total=total, free=total - used, used=used)

    def nvmlDeviceGetCudaComputeCapability(self, h):
        return (9, 0)

    def nvmlDeviceGetPciInfo(self, h):
        return SimpleNamespace(
            busId=GPU_BUS[h.index].replace("0000:", "00000000:").upper().encode()
        )

    def nvmlDeviceGetNvLinkState(self, h, link):
        if not self.nvlink:
            raise err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if link >= 18:
            raise err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return (
            pynvml.NVML_FEATURE_ENABLED
            if link < len(self.links[h.index])
            else pynvml.NVML_FEATURE_DISABLED
        )

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h, link):
        return SimpleNamespace(busId=self.links[h.index][link])

    def nvmlDeviceGetMigMode(self, h):
        if not self.nvlink:
            raise err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return [pynvml.NVML_DEVICE_MIG_DISABLE, pynvml.NVML_DEVICE_MIG_DISABLE]

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [SimpleNamespace(pid=1000 + h.index)] if h.index < 2 else []

    def nvmlDeviceGetGraphicsRunningProcesses(self, h):
        raise err(pynvml.NVML_ERROR_NOT_SUPPORTED)
