"""Validators and kernel-text parsers of cgroup values."""

import pytest

from xhagent.cgroups import registry
from xhagent.cgroups import values as v
from xhagent.cgroups.io_weight import bfq_weight, enforcer, io_cost_enabled


def test_byte_sizes_with_suffixes_round_to_pages():
    assert v.bytes_or_max("4Gi") == 4 << 30
    assert (
        v.bytes_or_max("512M") == 512 * 10**6
    )  # M is 10**6 here as in every file (a whole number of pages)
    assert v.bytes_or_max("4G") == 4 * 10**9 - 4 * 10**9 % 4096 == 3_999_997_952
    assert v.bytes_or_max("4GB", page_round=False) == 4 * 10**9
    assert v.bytes_or_max("max") == "max"
    assert v.bytes_or_max(10_000) == 8192  # the kernel keeps whole pages
    assert v.bytes_or_max("10000", page_round=False) == 10_000
    for bad in ("4gb", "4g", "-1", "lots", True, 1.5, -1, "nan", "9" * 400, 2**63):
        with pytest.raises(ValueError):
            v.bytes_or_max(bad)


def test_cpu_max_forms_and_limits():
    assert v.cpu_max("50000 100000") == (50000, 100000)
    assert v.cpu_max("max") == ("max", 100000)
    assert v.cpu_max("max 100000\n") == ("max", 100000)
    assert v.format_cpu_max((50000, 100000)) == "50000 100000"
    with pytest.raises(ValueError, match="period 10 is out of range"):
        v.cpu_max("50000 10")
    with pytest.raises(ValueError, match="below the kernel's minimum"):
        v.cpu_max("10 100000")
    with pytest.raises(ValueError):
        v.cpu_max("1 2 3")


def test_cpu_lists_are_held_compressed():
    assert v.cpulist("0,1,2,5") == "0-2,5"
    assert v.cpulist("0-1\n") == "0-1"
    assert v.cpulist("") == ""
    with pytest.raises(ValueError, match="goes backwards"):
        v.cpulist("3-1")
    with pytest.raises(ValueError, match="expected a list"):
        v.cpulist("0-1,x")


def test_weights_range():
    assert v.weight(1) == 1 and v.weight(10000) == 10000
    for bad in (0, 10001, "abc", 2.5):
        with pytest.raises(ValueError):
            v.weight(bad)


def test_keyed_files_parse():
    assert v.parse_weight_file("default 100\n259:0 800\n") == {"default": 100, "259:0": 800}
    assert v.parse_nested_keyed("259:0 rbps=max wbps=1048576 riops=max wiops=max\n") == {
        "259:0": {"rbps": "max", "wbps": 1048576, "riops": "max", "wiops": "max"}
    }
    assert v.parse_flat_keyed("populated 1\nfrozen 0\n") == {"populated": 1, "frozen": 0}
    assert registry.IO_WEIGHT.format({"default": 500, "259:0": 800}) == ["default 500", "259:0 800"]
    assert io_cost_enabled("259:0 enable=1 ctrl=auto rpct=0.00\n8:0 enable=0 ctrl=auto\n") == {
        "259:0"
    }


def test_bfq_weight_scaled_as_systemd_does():
    # identity up to the default 100, then 100 + (w-100)*900/9900
    assert [bfq_weight(w) for w in (1, 50, 100, 500, 1000, 10000)] == [1, 50, 100, 136, 181, 1000]


def test_enforcer_per_device():
    assert enforcer("259:0", {"259:0"}, "none").name == "io.cost"
    assert enforcer("259:0", set(), "bfq").name == "bfq"
    none = enforcer("259:0", set(), "mq-deadline")
    assert none.name == "none" and "not enforced" in none.note


def test_registry_declares_each_file_once_and_lookup_suggests():
    names = [f.name for f in registry.BY_NAME.values()]
    assert len(names) == len(set(names))
    assert registry.lookup("memory.max") is registry.MEMORY_MAX
    with pytest.raises(KeyError, match="did you mean 'memory.max'"):
        registry.lookup("memory.mx")
    assert registry.BY_POLICY[("cpu", "max.burst")] is registry.CPU_MAX_BURST
