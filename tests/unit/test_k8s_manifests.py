"""packaging/k8s/daemonset.yaml and packaging/Containerfile: the manifests read through the
kubernetes client's typed models (a misspelt field fails), the DaemonSet giving the agent
what it needs on a node, its policies valid, and the image installing the packaged agent."""

import re
from pathlib import Path

import pytest
import yaml
from kube import deserialize, load, load_manifest
from test_crd import validator

from xhagent.daemon.api.client import DEFAULT_SOCKET
from xhagent.daemon.daemon import DEFAULT_POLICIES
from xhagent.policy.documents import load_any

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "packaging/k8s/daemonset.yaml"
CONTAINERFILE = ROOT / "packaging/Containerfile"


def documents() -> list[dict]:
    return [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d is not None]


def daemonset() -> dict:
    return next(d for d in documents() if d["kind"] == "DaemonSet")


def test_every_document_is_read_strictly_by_the_client_models():
    kinds = [type(load_manifest(d)).__name__ for d in documents()]
    assert kinds == ["V1Namespace", "V1ConfigMap", "V1DaemonSet"]


def test_a_misspelt_field_is_caught_where_the_client_alone_drops_it():
    doc = daemonset()
    doc["spec"]["template"]["spec"]["hostPid"] = True  # for hostPID
    doc["spec"]["template"]["spec"]["containers"][0]["securityContext"]["priviledged"] = True
    # The client's deserialize keeps what it knows and drops the rest, without a word:
    pod = deserialize(doc, "V1DaemonSet").spec.template.spec
    assert pod.host_pid is True  # the correct spelling is still there
    del doc["spec"]["template"]["spec"]["hostPID"]
    assert deserialize(doc, "V1DaemonSet").spec.template.spec.host_pid is None
    with pytest.raises(ValueError) as info:
        load(doc, "V1DaemonSet")
    assert str(info.value).splitlines() == [
        ".spec.template.spec.containers[0].securityContext.priviledged: "
        "unknown field of V1SecurityContext",
        ".spec.template.spec.hostPid: unknown field of V1PodSpec",
    ]


def test_a_wrong_type_and_a_missing_required_field_are_caught():
    doc = daemonset()
    doc["spec"]["template"]["spec"]["hostPID"] = "yes"
    with pytest.raises(ValueError, match=r"\.hostPID: expected bool, got str"):
        load(doc, "V1DaemonSet")
    doc = daemonset()
    del doc["spec"]["template"]["spec"]["containers"][0]["name"]
    # The client's own check (its wording differs between client versions).
    with pytest.raises(ValueError, match=r"(?s)V1Container.*name|`name`, must not be `None`"):
        load(doc, "V1DaemonSet")


def test_the_daemonset_gives_the_agent_the_node():
    ds = load_manifest(daemonset())
    pod = ds.spec.template.spec
    assert pod.host_pid and pod.host_network
    (c,) = pod.containers
    assert c.security_context.privileged
    mounts = {m.mount_path: m for m in c.volume_mounts}
    volumes = {v.name: v for v in pod.volumes}

    def host_path(mount_path: str) -> str:
        return volumes[mounts[mount_path].name].host_path.path

    assert host_path("/sys/fs/cgroup") == "/sys/fs/cgroup"
    assert host_path("/sys/kernel/btf") == "/sys/kernel/btf" and mounts["/sys/kernel/btf"].read_only
    # The agent's own defaults, kept on the host: the socket's directory and the state.
    assert host_path(str(Path(DEFAULT_SOCKET).parent)) == "/run/xhagent"
    assert host_path("/var/lib/xhagent") == "/var/lib/xhagent"
    policies = volumes[mounts[str(DEFAULT_POLICIES)].name].config_map
    assert policies.name == "xhagent-policies"
    assert ds.spec.selector.match_labels.items() <= ds.spec.template.metadata.labels.items()
    # The agent runs in the host's cgroup namespace, as the packaged binary.
    assert c.command[:2] == ["nsenter", "--cgroup=/proc/1/ns/cgroup"]
    assert c.command[-1] == "/usr/bin/xhagent" and c.args[0] == "run"
    port = next(a for a in c.args if a.startswith("--metrics-addr="))
    assert port.endswith(f":{c.ports[0].container_port}")


def test_the_configmap_holds_policies_the_agent_and_the_crd_schema_accept(tmp_path):
    config_map = next(d for d in documents() if d["kind"] == "ConfigMap")
    assert config_map["data"]
    for name, text in config_map["data"].items():
        path = tmp_path / name
        path.write_text(text)
        assert load_any(path), name  # the agent's own reader
        doc = yaml.safe_load(text)
        validator(doc["kind"]).validate(doc)


def test_the_containerfile_installs_the_package_make_package_builds():
    text = CONTAINERFILE.read_text()
    assert re.search(r"^FROM debian:12-slim$", text, re.M)
    assert "COPY dist/xhagent_*_amd64.deb /tmp/" in text
    assert "apt-get install -y --no-install-recommends /tmp/xhagent_*_amd64.deb" in text
    build = (ROOT / "packaging/build.py").read_text()
    assert 'f"xhagent_{ver}_amd64.deb"' in build  # the name the COPY globs
    assert 'ENTRYPOINT ["/usr/bin/xhagent"]' in text
