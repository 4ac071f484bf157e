"""YAML with positions: every user error is FILE:LINE:COL: message."""
import pytest

from xhagent.spec import SpecError, did_you_mean, load_text

POLICY = """\
apiVersion: xh.scheduling/v1
kind: CgroupPolicy
metadata: {name: io-classes}
spec:
  groups:
    - name: latency-critical
      io: {weight: 500, devices: {nvme0n1: 800}}
      cpu: {wieght: 400}
---
kind: Task
spec: {priority: 150}
"""


def test_values_are_plain_and_positions_kept():
    first, second = load_text(POLICY, "p.yaml")
    assert first.value["spec"]["groups"][0]["io"]["devices"] == {"nvme0n1": 800}
    assert first.position(("spec", "groups", 0, "io", "weight")) == (7, 20)
    assert second.index == 1 and second.value["kind"] == "Task"


def test_unknown_field_points_at_the_key_with_a_suggestion():
    doc = load_text(POLICY, "p.yaml")[0]
    cpu = doc.root["spec"]["groups"][0]["cpu"]
    with pytest.raises(SpecError) as info:
        cpu.mapping({"weight", "idle", "max", "max.burst"})
    assert str(info.value) == "p.yaml:8:13: unknown field 'spec.groups.cpu.wieght' (did you mean 'weight'?)"


def test_range_type_choice_and_missing_errors():
    doc = load_text(POLICY, "p.yaml")[1]
    with pytest.raises(SpecError, match=r"^p.yaml:11:18: spec.priority: 150 is out of range 0..100$"):
        doc.root["spec"]["priority"].int(0, 100)
    with pytest.raises(SpecError, match=r"^p.yaml:10:7: kind: 'Task' is not one of CgroupPolicy, SchedulingPolicy$"):
        doc.root["kind"].str(["CgroupPolicy", "SchedulingPolicy"])
    with pytest.raises(SpecError, match=r"^p.yaml:11:7: missing required field 'spec.deadline'$"):
        doc.root["spec"]["deadline"].str()
    assert doc.root["spec"]["deadline"].str(default=None) is None
    with pytest.raises(SpecError, match="expected a list, got a mapping"):
        doc.root["spec"].seq()


def test_parse_locates_a_parser_error():
    doc = load_text("cpuset: {cpus: 3-1}\n", "c.yaml")[0]

    def cpus(text):
        lo, hi = map(int, text.split("-"))
        if lo > hi:
            raise ValueError("range goes backwards")
        return list(range(lo, hi + 1))

    with pytest.raises(SpecError, match=r"^c.yaml:1:16: cpuset.cpus: '3-1' is not a valid cpu list: range goes backwards$"):
        doc.root["cpuset"]["cpus"].parse(cpus, "cpu list")


def test_syntax_error_and_duplicate_key():
    with pytest.raises(SpecError, match=r"^bad.yaml:2:\d+: invalid YAML"):
        load_text("a: [1, 2\nb: 3\n", "bad.yaml")
    with pytest.raises(SpecError, match=r"^dup.yaml:2:1: duplicate key 'kind'$"):
        load_text("kind: Task\nkind: CgroupPolicy\n", "dup.yaml")


def test_did_you_mean():
    assert did_you_mean("minCudaVersoin", ["minCudaVersion", "minMemoryGB"]) == " (did you mean 'minCudaVersion'?)"
    assert did_you_mean("zzz", ["minCudaVersion"]) == ""


def test_errors_are_collected_in_file_order_and_capped():
    from xhagent.spec import SpecErrors

    doc = load_text("".join(f"k{i}: x\n" for i in range(30)), "m.yaml")[0]
    for key in reversed(list(doc.value)):
        with doc.collecting():
            doc.root[key].int()
    with doc.collecting():
        doc.root["k0"].str()  # valid: collects nothing
    with pytest.raises(SpecErrors) as info:
        doc.errors.raise_if_any()
    lines = str(info.value).splitlines()
    assert len(info.value.errors) == 30 and info.value.total == 30
    assert lines[0] == "m.yaml:1:5: k0: expected an integer, got a string"
    assert lines[19].startswith("m.yaml:20:6: k19:")
    assert lines[20] == "m.yaml: 30 errors in all, 10 more not shown"
    assert isinstance(info.value, SpecError) and (info.value.line, info.value.col) == (1, 5)


def test_no_errors_raises_nothing():
    doc = load_text("a: 1\n", "m.yaml")[0]
    with doc.collecting():
        assert doc.root["a"].int() == 1
    doc.errors.raise_if_any()
    assert not doc.errors
