"""CgroupPolicy files: what they mean, and FILE:LINE:COL errors for what they must not say."""

from pathlib import Path

import pytest

from xhagent.cgroups.policy import load_policy, load_policy_text
from xhagent.spec import SpecError

EXAMPLE = Path(__file__).resolve().parents[2] / "configs/examples/cgroup-policy.yaml"
HEAD = "apiVersion: xh.scheduling/v1\nkind: CgroupPolicy\nmetadata: {name: t}\nspec:\n  groups:\n"


@pytest.fixture
def sys_root(tmp_path):
    for name, dev in (("nvme0n1", "259:0"), ("vda", "254:0")):
        (tmp_path / "block" / name).mkdir(parents=True)
        (tmp_path / "block" / name / "dev").write_text(dev + "\n")
    return tmp_path


def load(groups, sys_root):
    return load_policy_text(HEAD + groups, "p.yaml", sys_root)


def test_the_example_resolves_devices_and_flattens_groups(sys_root):
    policy = load_policy(EXAMPLE, sys_root)
    assert policy.name == "io-classes"
    assert [g.path for g in policy.groups] == ["latency-critical", "latency-critical/web", "batch"]
    lc = policy.groups[0]
    assert lc.settings == {
        "io.weight": {"default": 500, "259:0": 800},
        "cpu.weight": 400,
        "cpu.max": (50000, 100000),
        "cpuset.cpus": "0-1",
        "cpuset.mems": "0",
        "memory.high": 3 << 30,
        "memory.max": 4 << 30,
    }
    assert lc.devices == {"259:0": "nvme0n1"}
    assert policy.groups[2].settings == {"io.weight": {"default": 100}, "pids.max": 4096}
    assert set(policy.controllers()) == {"io", "cpu", "cpuset", "memory", "pids"}


# Mistakes in spec.groups and the located message for each (test_crd.py checks the CRD
# schema refuses the ones it can).
LOCATED_ERRORS = [
    (
        "    - name: a\n      cpu: {wieght: 400}\n",
        "p.yaml:7:13: unknown field 'spec.groups.0.cpu.wieght' (did you mean 'weight'?)",
    ),
    (
        "    - name: a\n      io: {weight: 0}\n",
        "p.yaml:7:20: spec.groups.0.io.weight: 0 is not a valid weight (1..10000): "
        "0 is out of range 1..10000",
    ),
    (
        "    - name: a\n      cpuset: {cpus: 3-1}\n",
        "p.yaml:7:22: spec.groups.0.cpuset.cpus: '3-1' is not a valid cpu list: "
        "range 3-1 goes backwards",
    ),
    (
        "    - name: a\n      io: {devices: {a/b: 800}}\n",
        "p.yaml:7:22: spec.groups.0.io.devices: 'a/b' is not a block device name",
    ),
    (
        "    - name: " + "x" * 256 + "\n",
        "p.yaml:6:13: spec.groups.0.name: '"
        + "x" * 256
        + "' is not a valid group name: a group name is at most 255 bytes",
    ),
    (
        "    - name: a\n      memory: {max: 4gb}\n",
        "p.yaml:7:21: spec.groups.0.memory.max: '4gb' is not a valid limit: "
        "expected a size such as 512Mi, 4Gi or max, "
        "got '4gb' (units: k M G T P E, Ki Mi Gi Ti Pi Ei, optionally with B; case matters)",
    ),
    (
        "    - name: a\n      memory: {max: " + "9" * 400 + "Gi}\n",
        "p.yaml:7:21: spec.groups.0.memory.max: '"
        + "9" * 400
        + "Gi' is not a valid limit: size "
        + "9" * 20
        + "... (402 characters) is larger than 8 EiB",
    ),
    (
        "    - name: a\n      cpu: {max: '50000 100000', max.burst: 60000}\n",
        "p.yaml:7:45: cpu.max.burst 60000 exceeds the cpu.max quota 50000 (the kernel refuses it)",
    ),
    (
        "    - name: ../etc\n",
        "p.yaml:6:13: spec.groups.0.name: '../etc' is not a valid group name: '../etc': "
        "a group name is letters, digits and _ . @ - (not starting with . @ or -)",
    ),
    ("    - name: a\n    - name: a\n", "p.yaml:7:13: group 'a' is declared twice"),
    (
        "    - name: 5\n",
        "p.yaml:6:13: spec.groups.0.name: 5 is not a valid group name: "
        "a group name is text, not an integer (quote it)",
    ),
    (
        "    - name: a\n      memroy: {max: 1Gi}\n",
        "p.yaml:7:7: unknown field 'spec.groups.0.memroy' (did you mean 'memory'?)",
    ),
]


@pytest.mark.parametrize("groups, message", LOCATED_ERRORS)
def test_errors_are_located(groups, message, sys_root):
    with pytest.raises(SpecError) as info:
        load(groups, sys_root)
    assert str(info.value) == message


def test_wrong_api_version_and_kind(sys_root):
    with pytest.raises(
        SpecError, match=r"^p.yaml:1:13: apiVersion: 'v2' is not one of xh.scheduling/v1"
    ):
        load_policy_text(
            "apiVersion: v2\nkind: CgroupPolicy\nspec: {groups: []}\n", "p.yaml", sys_root
        )
    with pytest.raises(SpecError, match="expected exactly one CgroupPolicy document, found 0"):
        load_policy_text("kind: Task\n", "p.yaml", sys_root)


def test_a_device_this_node_lacks_is_not_a_file_error_but_noted(sys_root):
    policy = load(
        "    - name: a\n      io: {weight: 200, devices: {nvme0n2: 800, vda: 300}}\n", sys_root
    )
    assert policy.absent == [
        "p.yaml:7:35: spec.groups.0.io.devices: no block device 'nvme0n2' on this node "
        "(did you mean 'nvme0n1'?); devices: nvme0n1, vda"
    ]
    assert policy.groups[0].settings["io.weight"] == {"default": 200, "254:0": 300}


def test_an_unquoted_maj_min_device_key_is_a_file_error_that_says_to_quote_it(sys_root):
    # YAML 1.1 reads 254:0 as 254 * 60 + 0; quoted, the same key is the device vda
    with pytest.raises(SpecError) as info:
        load("    - name: a\n      io: {weight: 200, devices: {254:0: 300}}\n", sys_root)
    assert str(info.value) == (
        "p.yaml:7:35: spec.groups.0.io.devices: device 15240 is a number, not a name: YAML "
        'reads an unquoted MAJ:MIN such as 252:0 as a base-60 number; quote it ("252:0")'
    )
    policy = load('    - name: a\n      io: {weight: 200, devices: {"254:0": 300}}\n', sys_root)
    assert policy.groups[0].settings["io.weight"] == {"default": 200, "254:0": 300}


def test_every_error_of_a_file_at_once_in_file_order(sys_root):
    text = (
        "    - name: a\n      cpu: {weight: 0, wieght: 3}\n      memory: {max: 4gb}\n"
        "      children:\n        - name: ../x\n        - name: b\n          pids: {max: -1}\n"
        "    - name: a\n"
    )
    with pytest.raises(SpecError) as info:
        load(text, sys_root)
    lines = str(info.value).splitlines()
    assert [line.split(": ")[0] for line in lines] == [
        "p.yaml:7:21",
        "p.yaml:7:24",
        "p.yaml:8:21",
        "p.yaml:10:17",
        "p.yaml:12:23",
        "p.yaml:13:13",
    ]
    assert "declared twice" in lines[-1]


def test_nesting_is_capped_with_a_located_error(sys_root):
    from xhagent.cgroups.policy import MAX_NESTING

    deep, indent = "", "    "
    for i in range(MAX_NESTING + 5):
        deep += f"{indent}- name: g{i}\n{indent}  children:\n"
        indent += "    "
    deep += f"{indent}- name: leaf\n"
    with pytest.raises(SpecError) as info:
        load(deep, sys_root)
    assert f"groups nest deeper than {MAX_NESTING} levels" in str(info.value)
    assert len(str(info.value).splitlines()) == 1


def test_task_classes_with_their_weights_and_every_error_located():
    head = "apiVersion: xh.scheduling/v1\nkind: CgroupPolicy\nmetadata: {name: c}\nspec:\n"
    good = head + (
        "  classes:\n    - {name: latency, cpu: {weight: 1000}, io: {weight: 900}}\n"
        "    - {name: bulk}\n"
    )
    p = load_policy_text(good, "c.yaml")
    assert p.classes == {"latency": (1000, 900), "bulk": (100, 100)} and p.groups == []
    bad = head + (
        "  classes:\n    - {name: Latency, cpu: {weight: 0}}\n"
        "    - {name: bulk, ram: 3}\n    - {name: bulk}\n"
    )
    with pytest.raises(SpecError) as info:
        load_policy_text(bad, "c.yaml")
    assert [line.split(": ")[0] for line in str(info.value).splitlines()] == [
        "c.yaml:6:14",
        "c.yaml:6:37",
        "c.yaml:7:20",
        "c.yaml:8:14",
    ]
    assert "is declared twice" in str(info.value)
    with pytest.raises(
        SpecError, match=r"^c.yaml:4:7: spec: expected groups, classes, ioCost or several"
    ):
        load_policy_text(head.replace("spec:\n", "spec: {}\n"), "c.yaml")
