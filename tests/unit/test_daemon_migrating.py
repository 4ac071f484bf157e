"""The daemon's migration controller, its pure parts: the booked load of each device, the
room check, whether a placement can be committed without taking what another task holds,
and NVML's refusal where no NVIDIA driver is bound."""

import types

from xhagent.daemon.loop.migration import MigrationController, booked_loads, has_room
from xhagent.daemon.loop.moves import fits
from xhagent.daemon.loop.nvml import Nvml
from xhagent.node_model import Accelerator, Bytes, Gpu, Node, Version
from xhagent.policy.placement import Candidate
from xhagent.policy.state import Allocation, Cluster, GpuShare

GIB = 1 << 30


def cluster() -> Cluster:
    gpus = tuple(
        Gpu(i, f"GPU-{i}", "G", Bytes(16 * GIB), Bytes(16 * GIB), Version(12, 4), Version(9, 0))
        for i in range(3)
    )
    chips = (Accelerator(0, "tpu", "accel0"), Accelerator(1, "tpu", "accel1"))
    return Cluster.of([Node("n", gpus=gpus, accelerators=chips)])


def test_booked_load_is_the_reserved_share_a_whole_gpu_and_a_held_chip_are_full():
    c = cluster()
    c.commit(Allocation("a", "n", (), 0, (GpuShare(0, 4 * GIB, False),)))
    c.commit(Allocation("b", "n", (), 0, (GpuShare(0, 8 * GIB, False),)))
    c.commit(Allocation("w", "n", (), 0, (GpuShare(1, 16 * GIB, True),)))
    c.commit(Allocation("t", "n", (), 0, tpus=(1,)))
    st = c.nodes["n"]
    assert booked_loads(st) == {
        "n/gpu0": 0.75,
        "n/gpu1": 1.0,
        "n/gpu2": 0.0,
        "n/tpu0": 0.0,
        "n/tpu1": 1.0,
    }
    assert [has_room(st, "gpu", i) for i in range(3)] == [True, False, True]
    assert [has_room(st, "tpu", i) for i in range(2)] == [True, False]
    c.release("b")
    assert booked_loads(st)["n/gpu0"] == 0.25


def test_a_placement_fits_only_where_nothing_it_takes_is_held():
    c = cluster()
    c.commit(Allocation("a", "n", (), 0, (GpuShare(0, 12 * GIB, False),)))
    c.commit(Allocation("w", "n", (), 0, (GpuShare(1, 16 * GIB, True),)))
    c.commit(Allocation("t", "n", (), 0, tpus=(0,)))
    st = c.nodes["n"]

    def cand(gpus=(), tpus=()):
        return Candidate("n", (), 0, tuple(gpus), 0.0, (), tuple(tpus))

    assert fits(st, cand([GpuShare(0, 4 * GIB, False)]), "x")
    assert not fits(st, cand([GpuShare(0, 5 * GIB, False)]), "x")  # 4 GiB left
    assert not fits(st, cand([GpuShare(0, 4 * GIB, True)]), "x")  # whole, but shared
    assert not fits(st, cand([GpuShare(1, 1, False)]), "x")  # held whole by w
    assert fits(st, cand([GpuShare(2, 16 * GIB, True)]), "x")
    assert not fits(st, cand([GpuShare(7, 1, False)]), "x")  # no such GPU
    assert not fits(st, cand(tpus=[0]), "x") and fits(st, cand(tpus=[1]), "x")
    assert not fits(st, cand([GpuShare(2, 1, False)]), "a")  # a holds a placement already


def test_nvml_is_not_loaded_without_the_driver_and_says_why(tmp_path):
    nvml = Nvml(sys_root=tmp_path)
    gpus = cluster().nodes["n"].node.gpus
    assert nvml.utilisation(gpus) == {}
    assert nvml.error == f"no NVIDIA driver: {tmp_path}/bus/pci/drivers/nvidia absent"
    assert nvml.utilisation(()) == {} and nvml._nvml is None


def test_nvml_utilisation_where_it_sees_the_gpu_booked_share_elsewhere(standin_nvml):
    stand_in, nvml = standin_nvml
    c = cluster()
    c.commit(Allocation("a", "n", (), 0, (GpuShare(1, 4 * GIB, False),)))
    st = c.nodes["n"]
    agent = types.SimpleNamespace(cluster=c, node=st.node)
    ctl = MigrationController(agent, nvml=nvml)
    devices, sources = ctl.devices()
    loads = {d.id: d.load for d in devices}
    assert loads == {"n/gpu0": 0.9, "n/gpu1": 0.25, "n/gpu2": 0.0, "n/tpu0": 0.0, "n/tpu1": 0.0}
    assert sources["n/gpu0"] == ("nvml", "")
    assert sources["n/gpu1"] == ("booked", "NVML does not see GPU 1 by its UUID")
    assert sources["n/tpu0"] == ("booked", "")
    ctl.devices()
    assert stand_in.inits == 1  # initialised once, not every round
