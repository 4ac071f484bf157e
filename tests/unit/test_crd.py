"""The CRDs of SchedulingPolicy and CgroupPolicy (packaging/k8s/crds.yaml): generated from
the field declarations the agent's own readers use, structural as the API server demands,
valid for every policy in configs/examples, and refusing each malformed policy the
readers refuse wherever JSON schema can say why. What it cannot say is listed here."""

import functools
import json
import re
from pathlib import Path

import jsonschema
import pytest
import yaml
from click.testing import CliRunner
from hypothesis import given, settings
from kube import load, structural_errors
from test_bad_input import BAD
from test_bad_input import LOADERS as BAD_INPUT_LOADERS
from test_cgroup_policy import HEAD as CGROUP_HEAD
from test_cgroup_policy import LOCATED_ERRORS as CGROUP_ERRORS
from test_policy_formats import FOUR_MISTAKES, policies
from test_policy_formats import HEAD as POLICY_HEAD
from test_policy_formats import LOCATED_ERRORS as POLICY_ERRORS

from xhagent import cli, crd
from xhagent.cgroups.policy import load_policy_text
from xhagent.policy.policy import dump_policy, parse_policy
from xhagent.spec import SpecError, load_text

ROOT = Path(__file__).resolve().parents[2]
CRDS = ROOT / "packaging/k8s/crds.yaml"
EXAMPLES = ROOT / "configs/examples"
KINDS = tuple(crd.BUILDERS)


@functools.cache
def validator(kind: str, flavour: str = "document") -> jsonschema.Draft4Validator:
    """OpenAPI v3.0's schema objects are JSON schema draft 4 (+ the x-kubernetes- keys, which
    jsonschema ignores): the document flavour closes every object to unknown fields."""
    schema = crd.document_schema(kind) if flavour == "document" else crd.openapi_schema(kind)
    jsonschema.Draft4Validator.check_schema(schema)
    return jsonschema.Draft4Validator(schema)


# ------------------------------------------------------------------ generated, one source


def test_the_committed_crds_are_what_the_field_declarations_generate():
    assert CRDS.read_text() == crd.render(), (
        "packaging/k8s/crds.yaml is stale: run `xhagent crd > packaging/k8s/crds.yaml`"
    )


def test_xhagent_crd_prints_them_as_yaml_or_a_json_list():
    res = CliRunner().invoke(cli.main, ["crd"])
    assert res.exit_code == 0 and res.output == CRDS.read_text()
    res = CliRunner().invoke(cli.main, ["crd", "--json"])
    assert res.exit_code == 0
    listed = yaml.safe_load(res.output)
    assert listed["kind"] == "List"
    assert listed["items"] == [d for d in yaml.safe_load_all(CRDS.read_text())]


def test_the_schema_holds_the_readers_ranges_and_choices():
    # Spot checks that the numbers come from the declarations, not a copy of them.
    from xhagent.cgroups import policy as cg
    from xhagent.cgroups import values as v
    from xhagent.policy import policy as sp

    assert crd.API_VERSION == sp.API_VERSION == cg.API_VERSION == "xh.scheduling/v1"
    spec = crd.openapi_schema("SchedulingPolicy")["properties"]["spec"]["properties"]
    assert spec["priority"] == {"type": "integer", "minimum": 0, "maximum": 100, "default": 50}
    assert spec["preemption"]["enum"] == list(sp.PREEMPTION)
    group = crd.openapi_schema("CgroupPolicy")["properties"]["spec"]["properties"]["groups"]
    weight = group["items"]["properties"]["cpu"]["properties"]["weight"]
    assert (weight["minimum"], weight["maximum"]) == v.WEIGHT_RANGE


@pytest.mark.parametrize("kind", KINDS)
def test_each_crd_is_a_strict_v1_custom_resource_definition(kind):
    docs = {d["spec"]["names"]["kind"]: d for d in yaml.safe_load_all(CRDS.read_text())}
    obj = load(docs[kind], "V1CustomResourceDefinition")
    assert obj.spec.group == "xh.scheduling" and obj.spec.scope == "Cluster"
    assert [v.name for v in obj.spec.versions] == ["v1"] and obj.spec.versions[0].storage
    assert obj.metadata.name == f"{obj.spec.names.plural}.xh.scheduling"


def test_a_misspelt_field_of_a_crd_is_caught():
    doc = next(yaml.safe_load_all(CRDS.read_text()))
    doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"][
        "priority"
    ]["maximun"] = 100
    with pytest.raises(ValueError, match=r"\.properties\.priority\.maximun: unknown field"):
        load(doc, "V1CustomResourceDefinition")


@pytest.mark.parametrize("kind", KINDS)
def test_each_schema_is_structural_as_the_api_server_requires(kind):
    schema = crd.openapi_schema(kind)
    assert structural_errors(schema) == []
    # A default must pass its own node's checks (the API server validates defaults).
    for node in _nodes(schema):
        if "default" in node:
            jsonschema.Draft4Validator(node).validate(node["default"])


def test_the_structural_check_catches_what_the_api_server_refuses():
    closed = crd.document_schema("SchedulingPolicy")
    assert any("cannot be set to false" in e for e in structural_errors(closed))
    assert any("must not be used at the root" in e for e in structural_errors(closed))
    bad = {"type": "object", "properties": {"a": {"anyOf": [{"type": "string"}]}, "b": {}}}
    assert sorted(structural_errors(bad)) == [
        "openAPIV3Schema.properties[a].anyOf[0].type: must be empty to be structural",
        "openAPIV3Schema.properties[a].type: must not be empty (field)",
        "openAPIV3Schema.properties[b].type: must not be empty (field)",
    ]


def _nodes(schema):
    yield schema
    for sub in schema.get("properties", {}).values():
        yield from _nodes(sub)
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            yield from _nodes(schema[key])


# ------------------------------------------------------------------ the examples are valid


def example_documents():
    for path in sorted(EXAMPLES.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") in KINDS:
                yield pytest.param(doc, id=f"{path.name}:{doc['kind']}")


@pytest.mark.parametrize("flavour", ["document", "crd"])
@pytest.mark.parametrize("doc", list(example_documents()))
def test_every_policy_example_is_valid_against_its_schema(doc, flavour):
    validator(doc["kind"], flavour).validate(doc)


@settings(max_examples=100, deadline=None)
@given(policies)
def test_every_policy_the_agent_can_hold_is_valid_against_the_schema(p):
    # Generated policies, written as the agent writes them and sent as JSON: the schema
    # accepts at least what the reader does.
    doc = json.loads(json.dumps(dump_policy(p)))
    validator("SchedulingPolicy").validate(doc)
    validator("SchedulingPolicy", "crd").validate(doc)


def test_the_examples_hold_both_kinds():
    assert {p.values[0]["kind"] for p in example_documents()} == set(KINDS)


# ------------------------------------------------------------------ malformed policies

# The readers' refusals no JSON schema (of the structural kind a CRD must be) can make:
# validator message fragment -> why. The API server takes these; the agent refuses them,
# located, when it reads the policy.
NOT_IN_SCHEMA = {
    "is already set at line": "the same constraint field in two items of the list",
    "operator Exists takes no values": "which operator needs `values` is a rule across fields",
    "goes backwards": "a cpu list's shape: the schema checks its characters only",
    "is not a block device name": "device names are mapping keys; a CRD cannot constrain keys",
    "is larger than 8 EiB": "a size's text of any length matches; its value is the agent's",
    "exceeds the cpu.max quota": "cpu.max.burst against cpu.max is a rule across fields",
    "is not below hotAbove": "migration.idleBelow against hotAbove is a rule across fields",
    "levels are mlq's": "queueing.levels against its algorithm is a rule across fields",
    "only one level may leave out matchLabels": "one fallback among a list's items is a rule "
    "across items",
    "is declared twice": "unique names in a list (uniqueItems is refused in a CRD, and "
    "would compare whole items)",
}
# What the readers accept in a spelling JSON cannot carry as the agent reads it: the schema
# asks for the one form that survives a trip through the API server.
SCHEMA_STRICTER = {
    "unquoted CUDA version": (
        "SchedulingPolicy",
        "  matchRules:\n    - selector: {}\n      constraints:\n"
        "        - hardware: {gpu: {minCudaVersion: 12.10}}\n",
    ),  # a JSON number 12.10 is 12.1: the agent reads the text, the CRD asks for a string
    "CUDA version as a list": (
        "SchedulingPolicy",
        "  matchRules:\n    - selector: {}\n      constraints:\n"
        "        - hardware: {gpu: {minCudaVersion: [12, 2]}}\n",
    ),
    "label value as a float": (
        "SchedulingPolicy",
        "  matchRules:\n    - selector: {matchLabels: {version: 1.5}}\n",
    ),  # Kubernetes label values are strings; the CRD takes an integer or a string
}
# More mistakes, each a different schema keyword (the reused tables cover the rest).
MORE = [
    ("SchedulingPolicy", "  priority: 5\n"),  # required matchRules
    ("SchedulingPolicy", "  matchRules: []\n"),  # minItems
    ("SchedulingPolicy", "  matchRules:\n    - selector: {matchLabels: {a: true}}\n"),  # type
    (
        "SchedulingPolicy",
        "  matchRules:\n    - selector: {}\n      constraints:\n        - io: {class: fast}\n",
    ),
    (
        "SchedulingPolicy",
        "  matchRules:\n    - selector: {}\n      constraints:\n        - memory: 4gb\n",
    ),
    (
        "SchedulingPolicy",
        "  matchRules:\n"
        "    - selector: {matchExpressions: [{key: a, operator: Has, values: [x]}]}\n",
    ),
    ("SchedulingPolicy", "  matchRules:\n    - constraints: []\n"),  # required selector
    ("CgroupPolicy", "  groups:\n    - name: a\n      cpu: {idle: 2}\n"),
    ("CgroupPolicy", "  groups:\n    - name: a\n      cpuset: {partition: exclusive}\n"),
    ("CgroupPolicy", "  groups:\n    - name: a\n      cpu: {max: 500}\n"),
    ("CgroupPolicy", "  groups:\n    - name: a\n      pids: {max: lots}\n"),
    ("CgroupPolicy", "  groups:\n    - name: a\n      io: {max: {vda: {rbps: 1M, xbps: 2}}}\n"),
    ("CgroupPolicy", "  groups:\n    - {name: a, children: [{name: b, cpu: {weight: 0}}]}\n"),
    ("CgroupPolicy", "  classes:\n    - {name: Latency, cpu: {weight: 0}}\n"),
    ("CgroupPolicy", "  {}\n"),  # groups, classes, ioCost or several
    ("CgroupPolicy", "  ioCost:\n    vda: {qos: {rpct: 101, ctrl: manual}}\n"),
    ("CgroupPolicy", "  ioCost:\n    vda: {model: {rbps: -1}, qs: {}}\n"),
]


def read(kind: str, text: str, tmp_path: Path):
    if kind == "SchedulingPolicy":
        return parse_policy(load_text(text, "p.yaml")[0])
    return load_policy_text(text, "p.yaml", tmp_path)  # no devices here: absent is no error


def policy_text(kind: str, body: str) -> str:
    return POLICY_HEAD.format(kind=kind) + body


def _id(message: str) -> str:
    return message.split(": ", 1)[1][:60]


def malformed():
    for kind, body, message in POLICY_ERRORS:
        if kind == "SchedulingPolicy":
            yield pytest.param(kind, policy_text(kind, body), id=_id(message))
    yield pytest.param("SchedulingPolicy", FOUR_MISTAKES, id="four mistakes")
    for groups, message in CGROUP_ERRORS:
        yield pytest.param("CgroupPolicy", CGROUP_HEAD + groups, id=_id(message))
    yield pytest.param(
        "CgroupPolicy", "apiVersion: v2\nkind: CgroupPolicy\nspec: {groups: []}\n", id="apiVersion"
    )
    for i, (kind, body) in enumerate(MORE):
        yield pytest.param(kind, policy_text(kind, body), id=f"more-{i}")


def cannot(line: str) -> str | None:
    """Why no schema refuses what this message says, when it is one of NOT_IN_SCHEMA."""
    return next((why for fragment, why in NOT_IN_SCHEMA.items() if fragment in line), None)


def message_path(message: str) -> str | None:
    """The dotted field a reader's message is about, or None when it names none."""
    rest = message.split(": ", 1)[1]
    if m := re.match(r"(?:unknown field|missing required field) '([^']+)'", rest):
        return m[1]
    if m := re.match(r"([\w.]+): ", rest):
        return m[1]
    return None


def covers(schema_path: str, path: str) -> bool:
    """A schema error at `schema_path` speaks of the field `path`: at it or a parent (an
    unknown or missing field is reported at its mapping), or the reader named it relative
    to its own mapping (`name:` of a class)."""
    s, p = schema_path.split(".") if schema_path else [], path.split(".")
    return p[: len(s)] == s or s[-len(p) :] == p


@pytest.mark.parametrize("kind,text", list(malformed()))
def test_the_schema_refuses_what_the_reader_refuses_where_it_can_say_why(kind, text, tmp_path):
    with pytest.raises(SpecError) as info:
        read(kind, text, tmp_path)
    lines = str(info.value).splitlines()
    errors = list(validator(kind).iter_errors(yaml.safe_load(text)))
    paths = [".".join(str(p) for p in e.absolute_path) for e in errors]
    for line in lines:
        if cannot(line) is not None:
            if len(lines) == 1:  # the list stays honest: nothing else refuses it either
                assert errors == [], f"the schema can say it now: {line}\n{errors[0].message}"
            continue
        path = message_path(line)
        assert path is not None, f"a reader's refusal that names no field: {line}"
        assert any(covers(p, path) for p in paths), (
            f"the reader says {line!r}; the schema says {[e.message for e in errors]}"
        )
    # The CRD's own schema refuses it too, but for unknown fields (the API server prunes
    # them, or refuses them under `kubectl apply --validate=strict`).
    if any("unknown field" not in line and cannot(line) is None for line in lines):
        assert list(validator(kind, "crd").iter_errors(yaml.safe_load(text)))


def test_every_refusal_the_schema_cannot_make_is_met_by_some_case(tmp_path):
    seen = set()
    for param in malformed():
        kind, text = param.values
        with pytest.raises(SpecError) as info:
            read(kind, text, tmp_path)
        seen |= {f for f in NOT_IN_SCHEMA if f in str(info.value)}
    assert seen == set(NOT_IN_SCHEMA)


@pytest.mark.parametrize("name", SCHEMA_STRICTER)
def test_the_spellings_the_schema_asks_to_write_otherwise(name, tmp_path):
    kind, body = SCHEMA_STRICTER[name]
    text = policy_text(kind, body)
    read(kind, text, tmp_path)  # the agent takes it
    assert list(validator(kind).iter_errors(yaml.safe_load(text)))


# Bad content of test_bad_input.py that never reaches a schema: a YAML-to-JSON decoder
# (kubectl's, the API server's) refuses it, or could not carry it, before any schema runs.
BEFORE_ANY_SCHEMA = {
    "alias bomb": "expanded by a decoder that follows aliases (the agent stops at the first)",
    "invalid UTF-8": "not text",
    "a NUL byte": "not YAML",
    "nesting 5000 deep": "refused by the YAML scanner",
    "a 5000-digit number": "not a number any decoder holds",
    "an impossible date": "not a date; JSON has none",
    "a python tag": "not a JSON type",
}


@pytest.mark.parametrize("bad", BAD)
@pytest.mark.parametrize("kind", KINDS)
def test_bad_content_is_refused_by_the_schema_or_before_it(kind, bad):
    text = BAD_INPUT_LOADERS[kind][1].encode() + BAD[bad]
    if bad in BEFORE_ANY_SCHEMA:
        if bad != "alias bomb":  # safe_load would build it; the agent's loader refuses it
            with pytest.raises((yaml.YAMLError, ValueError)):
                yaml.safe_load(text)
        return
    # NaN, infinity, huge numbers: JSON-able values where a mapping belongs.
    assert list(validator(kind).iter_errors(yaml.safe_load(text)))
