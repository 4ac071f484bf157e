"""The agent config (--config) is validated as policies are, and cpu lists are bounded."""

import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parent / "data/inventory"))
import fakes  # noqa: E402

from xhagent.config import ConfigError, parse_config  # noqa: E402
from xhagent.cpulist import format_cpulist, parse_cpulist  # noqa: E402
from xhagent.inventory.cli import inventory  # noqa: E402


@pytest.mark.parametrize(
    "text, message",
    [
        ("0-1000000000000000", "CPU 1000000000000000 is out of range: CPU ids are 0..8191"),
        ("0-8192", "CPU 8192 is out of range: CPU ids are 0..8191"),
        ("5-1", "range 5-1 is reversed"),
        ("-3", "'-3' is not a CPU id or a range such as 0-3"),
        ("0,x", "'x' is not a CPU id or a range such as 0-3"),
    ],
)
def test_cpulist_refuses_reversed_negative_and_huge_ids(text, message):
    with pytest.raises(ValueError) as err:
        parse_cpulist(text)
    assert str(err.value) == message


def test_cpulist_round_trip():
    assert parse_cpulist("0-2, 5,8191") == [0, 1, 2, 5, 8191]
    assert format_cpulist([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
    assert format_cpulist([]) == "" and format_cpulist([], empty="none") == "none"
    assert format_cpulist([3, 1, 2, 2]) == "1-3"


def test_every_config_error_at_once_located_with_did_you_mean():
    text = 'nodeNmae: x\nlabels: {rack: [1]}\nreservedCpus: "5-1"\n'
    with pytest.raises(ConfigError) as err:
        parse_config(text, "a.yaml")
    assert str(err.value).splitlines() == [
        "a.yaml:1:1: unknown field 'nodeNmae' (did you mean 'nodeName'?)",
        "a.yaml:2:16: labels.rack: label value must be a string, got a list",
        'a.yaml:3:15: reservedCpus: expected a cpu list such as "0,64" or "0-1" or [0, 64], '
        "got '5-1': "
        "range 5-1 is reversed",
    ]


@pytest.mark.parametrize(
    "value, message",
    [
        ("-3", "a.yaml:1:15: reservedCpus: -3 is out of range 0..8191"),
        ("[0, -2]", "a.yaml:1:19: reservedCpus.1: -2 is out of range 0..8191"),
        (
            '"0-100000000000"',
            'a.yaml:1:15: reservedCpus: expected a cpu list such as "0,64" or "0-1" or [0, 64], '
            "got '0-100000000000': CPU 100000000000 is out of range: CPU ids are 0..8191",
        ),
    ],
)
def test_negative_and_huge_reserved_cpus_are_refused(value, message):
    with pytest.raises(ConfigError) as err:
        parse_config(f"reservedCpus: {value}\n", "a.yaml")
    assert str(err.value) == message


@pytest.fixture
def server_args(tmp_path):
    sys_, proc = fakes.server(tmp_path)
    return ["--sysfs-root", str(sys_), "--procfs-root", str(proc)]


def test_reserved_cpus_the_node_lacks_are_refused_naming_those_it_has(tmp_path, server_args):
    cfg = tmp_path / "agent.yaml"
    cfg.write_text("labels: {rack: r1}\nreservedCpus: [0, 16, 40]\n")
    res = CliRunner().invoke(inventory, [*server_args, "--config", str(cfg), "--section", "labels"])
    assert res.exit_code == 2
    assert res.stderr == (
        f"xhagent inventory: {cfg}:2:15: reservedCpus: CPUs 16,40 are not on this node, "
        "which has CPUs 0-15\n"
    )
    cfg.write_text("reservedCpus: 15\n")
    assert (
        CliRunner()
        .invoke(inventory, [*server_args, "--config", str(cfg), "--section", "labels"])
        .exit_code
        == 0
    )


def test_sysfs_root_that_is_no_sysfs_tree_is_named(tmp_path):
    res = CliRunner().invoke(inventory, ["--sysfs-root", str(tmp_path)])
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert res.stderr == (
        f"xhagent inventory: {tmp_path} is not a sysfs tree: "
        f"{tmp_path}/devices/system/cpu/online is missing\n"
    )


def test_the_daemon_fields_are_read_and_checked_with_positions():
    cfg = parse_config(
        "stateDir: /srv/xh\nsocket: /run/x/x.sock\npoliciesDir: /etc/x/p.d\n"
        "subtree: xh.slice\nlogCap: 1Mi\n",
        "agent.yaml",
    )
    assert (cfg.state_dir, cfg.socket, cfg.policies_dir) == (
        Path("/srv/xh"),
        Path("/run/x/x.sock"),
        Path("/etc/x/p.d"),
    )
    assert (cfg.subtree, cfg.log_cap) == ("xh.slice", 1 << 20)
    with pytest.raises(ConfigError) as info:
        parse_config("stateDir: relative/dir\nlogCap: 0\nsokcet: /x\n", "agent.yaml")
    assert str(info.value).splitlines() == [
        "agent.yaml:1:11: stateDir: expected an absolute path, got 'relative/dir'",
        "agent.yaml:2:9: logCap: 0 is out of range 1..1099511627776",
        "agent.yaml:3:1: unknown field 'sokcet' (did you mean 'socket'?)",
    ]


def test_admin_group_is_a_group_name_or_empty():
    assert parse_config("adminGroup: ops\n", "agent.yaml").admin_group == "ops"
    assert parse_config("adminGroup: ''\n", "agent.yaml").admin_group == ""
    assert parse_config("nodeName: n1\n", "agent.yaml").admin_group is None
    with pytest.raises(ConfigError) as err:
        parse_config("adminGroup: 'wheel; rm -rf /'\n", "agent.yaml")
    assert str(err.value).startswith("agent.yaml:1:13: adminGroup: ")


def test_every_run_option_has_its_field_read_and_checked_with_positions():
    cfg = parse_config(
        "metricsAddr: '[::1]:0'\nlogFormat: json\ndebugEndpoints: on\nmaxStreams: 8\n"
        "taskSeries: 0\nspareRunDirs: 0\n",
        "agent.yaml",
    )
    assert (cfg.metrics_addr, cfg.log_format, cfg.debug_endpoints) == ("[::1]:0", "json", "on")
    assert (cfg.max_streams, cfg.task_series, cfg.spare_run_dirs) == (8, 0, 0)
    bare = parse_config("metricsAddr: off\ndebugEndpoints: off\n", "agent.yaml")
    assert (bare.metrics_addr, bare.debug_endpoints) == ("off", "off")  # YAML's false
    unset = parse_config("nodeName: n1\n", "agent.yaml")
    assert (unset.metrics_addr, unset.log_format, unset.max_streams) == (None, None, None)
    with pytest.raises(ConfigError) as info:
        parse_config(
            "metricsAddr: 9464\nlogFormat: xml\ndebugEndpoints: heaps\nmaxStreams: 0\n"
            "taskSeries: -1\nspareRunDirs: many\n",
            "agent.yaml",
        )
    assert str(info.value).splitlines() == [
        "agent.yaml:1:14: metricsAddr: expected a string, got an integer",
        "agent.yaml:2:12: logFormat: 'xml' is not one of text, json",
        "agent.yaml:3:17: debugEndpoints: 'heaps' is not one of off, on, heap "
        "(did you mean 'heap'?)",
        "agent.yaml:4:13: maxStreams: 0 is out of range 1..1048576",
        "agent.yaml:5:13: taskSeries: -1 is out of range 0..100000",
        "agent.yaml:6:15: spareRunDirs: expected an integer, got a string",
    ]
