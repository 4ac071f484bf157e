"""agent.yaml holds every `xhagent run` option, and an option given wins over the file: a
real agent started with only `--config` serves metrics where the file says, logs in its
format and caps task series as it says; the same file with flags takes the flags."""

import json
import os

import pytest

from xhagent.bench.local_agent import LocalAgent
from xhagent.daemon.api.v1 import agent_pb2 as pb

pytestmark = pytest.mark.host


def started(tmp_path, name, *flags):
    config = tmp_path / "agent.yaml"
    config.write_text(
        "metricsAddr: 127.0.0.1:0\nlogFormat: json\nmaxStreams: 4\ntaskSeries: 7\n"
        "debugEndpoints: on\n"
    )
    a = LocalAgent(tmp_path / name, f"xhagent-config-test-{os.getpid()}-{name}.slice")
    a.metrics_addr = None  # the file's
    a.extra = ["--config", str(config), *flags]
    a.start()
    return a


def test_the_files_options_apply_and_flags_win(tmp_path):
    a = started(tmp_path, "file")
    try:
        with a.client() as c:
            url = c.Health(pb.HealthRequest()).metrics_addr
        assert url.startswith("http://127.0.0.1:") and not url.startswith("http://127.0.0.1:9464")
        import urllib.request

        with urllib.request.urlopen(url.replace("/metrics", "/debug/stacks"), timeout=10) as r:
            assert b"thread" in r.read()  # debugEndpoints: on
    finally:
        a.stop()
        a.remove_subtree()
    lines = a.log.read_text().splitlines()
    assert all(json.loads(line)["message"] for line in lines if line.startswith("{"))
    assert any(line.startswith("{") for line in lines)  # logFormat: json

    b = started(tmp_path, "flags", "--log-format", "text", "--debug-endpoints", "off")
    try:
        with b.client() as c:
            url = c.Health(pb.HealthRequest()).metrics_addr
        import urllib.error
        import urllib.request

        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(url.replace("/metrics", "/debug/stacks"), timeout=10)
    finally:
        b.stop()
        b.remove_subtree()
    assert not any(line.startswith("{") for line in b.log.read_text().splitlines())


def test_a_bad_field_is_refused_at_start_naming_its_place(tmp_path):
    import subprocess
    import sys

    config = tmp_path / "agent.yaml"
    config.write_text("logFormat: xml\n")
    res = subprocess.run(
        [sys.executable, "-m", "xhagent.cli", "run", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 2
    assert f"{config}:1:12: logFormat: 'xml' is not one of text, json" in res.stderr
