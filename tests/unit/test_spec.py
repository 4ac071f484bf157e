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
    assert (
        str(info.value)
        == "p.yaml:8:13: unknown field 'spec.groups.0.cpu.wieght' (did you mean 'weight'?)"
    )


def test_range_type_choice_and_missing_errors():
    doc = load_text(POLICY, "p.yaml")[1]
    with pytest.raises(
        SpecError, match=r"^p.yaml:11:18: spec.priority: 150 is out of range 0..100$"
    ):
        doc.root["spec"]["priority"].int(0, 100)
    with pytest.raises(
        SpecError, match=r"^p.yaml:10:7: kind: 'Task' is not one of CgroupPolicy, SchedulingPolicy$"
    ):
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

    with pytest.raises(
        SpecError,
        match=r"^c.yaml:1:16: cpuset.cpus: '3-1' is not a valid cpu list: range goes backwards$",
    ):
        doc.root["cpuset"]["cpus"].parse(cpus, "cpu list")


def test_syntax_error_and_duplicate_key():
    with pytest.raises(SpecError, match=r"^bad.yaml:2:\d+: invalid YAML"):
        load_text("a: [1, 2\nb: 3\n", "bad.yaml")
    with pytest.raises(SpecError, match=r"^dup.yaml:2:1: duplicate key 'kind'$"):
        load_text("kind: Task\nkind: CgroupPolicy\n", "dup.yaml")
    with pytest.raises(
        SpecError, match=r"^dup.yaml:2:1: duplicate key '2026-01-01'$"
    ):  # not datetime.date(...)
        load_text("2026-01-01: a\n2026-01-01: b\n", "dup.yaml")


def test_did_you_mean():
    assert (
        did_you_mean("minCudaVersoin", ["minCudaVersion", "minMemoryGB"])
        == " (did you mean 'minCudaVersion'?)"
    )
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


# -- protections every loader gets (issue 11) ----------------------------------------

import os  # noqa: E402
import time  # noqa: E402

from xhagent.spec import MAX_BYTES, MAX_DEPTH, SpecErrors, load_file  # noqa: E402

ALIAS_BOMB = "a: &a [x,x,x,x,x,x,x,x,x]\n" + "".join(
    f"{c}: &{c} [*{p},*{p},*{p},*{p},*{p},*{p},*{p},*{p},*{p}]\n"
    for p, c in zip("abcdefgh", "bcdefghi", strict=True)
)


def test_an_alias_bomb_is_refused_at_the_first_alias_without_expanding():
    start = time.monotonic()
    with pytest.raises(SpecError) as info:
        load_text(ALIAS_BOMB, "bomb.yaml")
    assert time.monotonic() - start < 1
    assert (
        str(info.value) == "bomb.yaml:2:8: YAML aliases (*a) are not supported: write the value out"
    )


def test_nesting_is_capped_with_a_location_not_a_recursion_error():
    load_text("[" * MAX_DEPTH + "]" * MAX_DEPTH, "ok.yaml")
    with pytest.raises(
        SpecError, match=rf"^deep.yaml:1:{MAX_DEPTH + 1}: nested more than {MAX_DEPTH} levels deep$"
    ):
        load_text("[" * 5000 + "]" * 5000, "deep.yaml")
    with pytest.raises(SpecError, match=r"^deep.yaml:\d+:\d+: nested more than"):
        load_text("".join(" " * i + "a:\n" for i in range(700)), "deep.yaml")


@pytest.mark.parametrize(
    "text, message",
    [
        ("a: .nan\n", "b.yaml:1:4: '.nan' is not a finite number"),
        ("a: [1, -.inf]\n", "b.yaml:1:8: '-.inf' is not a finite number"),
        ("a: 1.0e+999\n", "b.yaml:1:4: '1.0e+999' is not a finite number"),
        (
            "a: 18446744073709551616\n",
            "b.yaml:1:4: 18446744073709551616 is too large (at most 64 bits)",
        ),
        (
            "a: " + "9" * 400 + "\n",
            "b.yaml:1:4: " + "9" * 40 + "... is too large (at most 64 bits)",
        ),
        ("a: " + "9" * 5000 + "\n", "b.yaml:1:4: invalid value '" + "9" * 40 + "': "),
        ("\nb: 2026-13-45\n", "b.yaml:2:4: invalid value '2026-13-45': month must be in 1..12"),
        (
            "a: !!python/name:os.system x\n",
            "b.yaml:1:4: invalid value 'x': could not determine a constructor",
        ),
        ("a: b\n\x00\n", "b.yaml:2:1: not a text file (character U+0000 is not allowed)"),
    ],
)
def test_values_python_cannot_hold_or_should_not_are_located_errors(text, message):
    with pytest.raises(SpecError) as info:
        load_text(text, "b.yaml")
    assert str(info.value).startswith(message)


def test_files_are_read_bounded_utf8_and_only_when_regular_or_a_fifo(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"kind: Task\nname: caf\xc3\xa9 \xff\n")
    with pytest.raises(SpecError, match=r"bad.yaml:2:12: not UTF-8 text \(byte 0xff\)$"):
        load_file(bad)
    utf8 = tmp_path / "u.yaml"
    utf8.write_bytes("n: \u00e9\u00e9\n\u00e9: \xff".encode("utf-8").replace(b"\xc3\xbf", b"\xff"))
    with pytest.raises(SpecError, match=r"u.yaml:2:4: not UTF-8"):
        load_file(utf8)
    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * (MAX_BYTES + 1))
    for path, message in [
        ("/dev/zero", "/dev/zero:1:1: is a character device, not a regular file"),
        (tmp_path, f"{tmp_path}:1:1: is a directory, not a regular file"),
        (big, f"{big}:1:1: is larger than 4,194,304 bytes, the limit for a spec file"),
    ]:
        with pytest.raises(SpecError) as info:
            load_file(path)
        assert str(info.value) == message
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    pid = os.fork()
    if pid == 0:
        with open(fifo, "w") as f:
            f.write("kind: Task\n")
        os._exit(0)
    assert load_file(fifo)[0].value == {"kind": "Task"}
    os.waitpid(pid, 0)


def test_a_mapping_reports_every_unknown_and_missing_field_at_once():
    doc = load_text("a: 1\nbb: 2\ncc: 3\n", "m.yaml")[0]
    with pytest.raises(SpecErrors) as info:
        doc.root.mapping({"a", "b", "c"}, required={"a", "d"})
    assert str(info.value).splitlines() == [
        "m.yaml:1:1: missing required field 'd'",
        "m.yaml:2:1: unknown field 'bb' (did you mean 'b'?)",
        "m.yaml:3:1: unknown field 'cc' (did you mean 'c'?)",
    ]
    assert doc.root.fields({"a"}) is True and len(doc.errors.errors) == 2
    assert doc.attempt(lambda: doc.root["bb"].str(), default="x") == "x" and doc.errors.total == 3


def test_numbers_keep_their_source_text_and_messages_show_it_not_a_repr():
    doc = load_text("v: 12.10\nq: '12.10'\nd: 2026-11-29\n", "v.yaml")[0]
    assert (
        doc.root["v"].value == 12.1
        and doc.root["v"].text == "12.10"
        and doc.root["q"].text == "12.10"
    )
    assert doc.root["v"].parse(str, "version", as_written=True) == "12.10"
    with pytest.raises(SpecError) as info:
        doc.root["d"].parse(int, "count")
    assert str(info.value).startswith("v.yaml:3:4: d: 2026-11-29 is not a valid count")
    with pytest.raises(SpecError, match="not a finite number"):
        load_text("n: 1\n")[0].root["n"].__class__(doc, ("n",), float("nan")).number()


def test_every_value_no_loader_may_see_is_reported_at_once():
    with pytest.raises(SpecErrors) as info:
        load_text("a: .nan\nb: [1, .inf]\n---\nc: 2026-13-45\nd: ok\n", "v.yaml")
    assert [line.split(": ")[0] for line in str(info.value).splitlines()] == [
        "v.yaml:1:4",
        "v.yaml:2:8",
        "v.yaml:4:4",
    ]


def test_a_huge_value_is_quoted_back_only_in_part():
    doc = load_text("v: " + "x" * 100_000 + "\n", "v.yaml")[0]
    with pytest.raises(SpecError) as info:
        doc.root["v"].parse(int, "count")
    assert len(str(info.value)) < 1200 and "x" * 500 + "...'" in str(info.value)


def test_a_one_sided_range_names_its_bound():
    doc = load_text("a: -1\nb: 7.5\n", "r.yaml")[0]
    with pytest.raises(SpecError, match=r"^r.yaml:1:4: a: -1 is below the minimum 0$"):
        doc.root["a"].int(0)
    with pytest.raises(SpecError, match=r"^r.yaml:2:4: b: 7.5 is above the maximum 5$"):
        doc.root["b"].number(hi=5)


def test_parsing_keeps_nothing_of_a_document_once_it_is_parsed():
    """A long-running agent parses every submission: the shared YAML constructor must not
    keep the values (or the failed ones) of the documents it has built."""
    from xhagent import spec

    for i in range(200):
        spec.load_text(f"a: {i}\nb: [x, {i}.5, true]\nc: {{d: e}}\n", "f.yaml")
        try:
            spec.load_text("when: 2026-13-45\n", "bad.yaml")
        except spec.SpecError:
            pass
    assert spec._constructor.constructed_objects == {}
    assert spec._constructor.recursive_objects == {}
