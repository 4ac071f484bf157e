"""Kubernetes manifests read strictly through the `kubernetes` client's typed models, and
a CRD schema checked against the API server's structural-schema rules.

The client's own deserialize drops a key its model does not have (`hostPid:` for
`hostPID:` vanishes, and the pod runs without the host's PID namespace), so `load` first
walks the document against each model's attribute_map: an unknown key anywhere is an
error naming its path. Then the client's deserialize builds the objects, which refuses a
missing required field (a container without a name) and a wrong enum value.
"""

from __future__ import annotations

import inspect
import json
import re
from typing import Any

import kubernetes.client as k8s
from kubernetes.client import ApiClient

PRIMITIVES = {"str": str, "int": int, "float": (int, float), "bool": bool}
# Fields the client types as `object` that hold schemas (a CRD's openAPIV3Schema).
SCHEMA_OBJECTS = {"items", "additional_properties", "additional_items"}


def unknown_fields(data: Any, type_name: str, path: str = "") -> list[str]:
    """`path: message` for every key or value the model `type_name` cannot hold."""
    if m := re.fullmatch(r"(?:list|List)\[(.+)\]", type_name):
        if not isinstance(data, list):
            return [f"{path or '.'}: expected a list"]
        return [
            e for i, item in enumerate(data) for e in unknown_fields(item, m[1], f"{path}[{i}]")
        ]
    if m := re.fullmatch(r"(?:dict\(str, (.+)\)|Dict\[str, (.+)\])", type_name):
        if not isinstance(data, dict):
            return [f"{path or '.'}: expected a mapping"]
        inner = m[1] or m[2]
        return [e for key, v in data.items() for e in unknown_fields(v, inner, f"{path}.{key}")]
    if type_name in PRIMITIVES:
        if isinstance(data, bool) and type_name != "bool":
            return [f"{path}: expected {type_name}, got a boolean"]
        if not isinstance(data, PRIMITIVES[type_name]):
            return [f"{path}: expected {type_name}, got {type(data).__name__}"]
        return []
    if type_name in ("object", "datetime", "date"):
        return []
    model = getattr(k8s, type_name)
    if not isinstance(data, dict):
        return [f"{path or '.'}: expected a {type_name} mapping"]
    by_key = {key: attr for attr, key in model.attribute_map.items()}
    errors = []
    for key, value in data.items():
        if key not in by_key:
            errors.append(f"{path}.{key}: unknown field of {type_name}")
            continue
        attr = by_key[key]
        inner = model.openapi_types[attr]
        if type_name == "V1JSONSchemaProps" and attr in SCHEMA_OBJECTS and isinstance(value, dict):
            inner = "V1JSONSchemaProps"
        errors += unknown_fields(value, inner, f"{path}.{key}")
    return errors


class _Response:  # what older clients deserialize: a response with .data
    def __init__(self, data: Any):
        self.data = json.dumps(data)


def deserialize(data: Any, type_name: str) -> Any:
    """The client's own reading (it drops unknown keys)."""
    client = ApiClient()
    if "content_type" in inspect.signature(client.deserialize).parameters:
        return client.deserialize(json.dumps(data), type_name, "application/json")
    return client.deserialize(_Response(data), type_name)


def load(data: dict[str, Any], type_name: str) -> Any:
    """The typed object; ValueError listing every unknown field, or the client's own."""
    if errors := unknown_fields(data, type_name):
        raise ValueError("\n".join(errors))
    return deserialize(data, type_name)


MODELS = {
    ("v1", "Namespace"): "V1Namespace",
    ("v1", "ServiceAccount"): "V1ServiceAccount",
    ("v1", "ConfigMap"): "V1ConfigMap",
    ("apps/v1", "DaemonSet"): "V1DaemonSet",
    ("apiextensions.k8s.io/v1", "CustomResourceDefinition"): "V1CustomResourceDefinition",
}


def load_manifest(doc: dict[str, Any]) -> Any:
    return load(doc, MODELS[(doc["apiVersion"], doc["kind"])])


# -- structural schemas ---------------------------------------------------------------------
_INT_OR_STRING = [{"type": "integer"}, {"type": "string"}]
_JUNCTORS = ("anyOf", "allOf", "oneOf", "not")
# What the API server forbids in any schema node of a v1 CRD (apiextensions validation).
_FORBIDDEN = {"$ref", "definitions", "patternProperties", "dependencies", "id", "additionalItems"}


def structural_errors(schema: dict[str, Any]) -> list[str]:
    """The API server's rules for a v1 CRD's openAPIV3Schema that this project's schemas
    could break (apiextensions-apiserver: ValidateStructural and the v1 schema checks)."""
    errors: list[str] = []
    if schema.get("type") != "object":
        errors.append("openAPIV3Schema.type: must be object at the root")
    if "additionalProperties" in schema:
        errors.append("openAPIV3Schema.additionalProperties: must not be used at the root")
    meta = schema.get("properties", {}).get("metadata")
    if meta is not None:
        rest = {k: v for k, v in meta.items() if k not in ("type", "properties")}
        if meta.get("type") != "object" or rest or set(meta.get("properties", {})) - {"name"}:
            errors.append("metadata: must not specify anything other than name and generateName")
    _node(schema, "openAPIV3Schema", "root", errors)
    return errors


def _node(s: dict[str, Any], path: str, level: str, errors: list[str]) -> None:
    for key in _FORBIDDEN & set(s):
        errors.append(f"{path}.{key}: not supported")
    if s.get("uniqueItems"):
        errors.append(f"{path}.uniqueItems: cannot be set to true")
    if s.get("additionalProperties") is False:
        errors.append(f"{path}.additionalProperties: cannot be set to false")
    if "additionalProperties" in s and "properties" in s:
        errors.append(f"{path}: additionalProperties and properties are mutually exclusive")
    typed = (
        "type" in s
        or s.get("x-kubernetes-int-or-string")
        or s.get("x-kubernetes-preserve-unknown-fields")
    )
    if not typed:
        errors.append(f"{path}.type: must not be empty ({level})")
    if s.get("x-kubernetes-int-or-string") and s.get("x-kubernetes-preserve-unknown-fields"):
        errors.append(f"{path}: int-or-string must not preserve unknown fields")
    if s.get("type") == "array" and "items" not in s:
        errors.append(f"{path}.items: must be specified")
    for name, sub in s.get("properties", {}).items():
        _node(sub, f"{path}.properties[{name}]", "field", errors)
    if isinstance(s.get("additionalProperties"), dict):
        _node(s["additionalProperties"], f"{path}.additionalProperties", "field", errors)
    if "items" in s:
        _node(s["items"], f"{path}.items", "items", errors)
    for junctor in _JUNCTORS:
        if junctor not in s:
            continue
        subs = s[junctor] if isinstance(s[junctor], list) else [s[junctor]]
        if junctor == "anyOf" and s.get("x-kubernetes-int-or-string") and subs == _INT_OR_STRING:
            continue  # the one typed form allowed inside a junctor
        for i, sub in enumerate(subs):
            _nested(sub, f"{path}.{junctor}[{i}]", errors)


def _nested(s: dict[str, Any], path: str, errors: list[str]) -> None:
    """Inside anyOf/allOf/oneOf/not: value checks only, nothing that shapes the object."""
    for key in ("type", "additionalProperties", "default", "title", "description", "nullable"):
        if key in s:
            errors.append(f"{path}.{key}: must be empty to be structural")
    for key in s:
        if key.startswith("x-kubernetes-"):
            errors.append(f"{path}.{key}: must be false to be structural")
    if "metadata" in s.get("properties", {}):
        errors.append(f"{path}.properties[metadata]: must not be specified in a nested context")
