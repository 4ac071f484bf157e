"""Which CPUs the agent's pool gets, and how agent.yaml's `pool:` and `--pool` combine:
pure, no root, no pool started."""

import pytest

from xhagent.config import ConfigError, PoolConfig, parse_config
from xhagent.daemon.exec.pooling import PoolConfigError, resolve_cpus
from xhagent.daemon.run import pool_settings


def test_auto_is_every_cpu_the_agent_may_use_but_the_reserved_ones():
    assert resolve_cpus(None, {0, 1, 2, 3}, {0}) == [1, 2, 3]
    assert resolve_cpus(None, {5, 2}, ()) == [2, 5]


def test_named_cpus_must_be_the_agents_and_not_reserved():
    assert resolve_cpus([3, 2, 3], {0, 1, 2, 3}, {0}) == [2, 3]
    with pytest.raises(PoolConfigError, match=r"^--pool: CPUs 4-5 are not the agent's to use "):
        resolve_cpus([2, 4, 5], {0, 1, 2, 3}, (), "--pool")
    with pytest.raises(PoolConfigError, match=r"\(its affinity is 0-3\)$"):
        resolve_cpus([9], {0, 1, 2, 3}, ())
    with pytest.raises(PoolConfigError, match=r"^a.yaml:3:9: pool.cpus: CPU 0 is reserved"):
        resolve_cpus([0, 1], {0, 1}, {0}, "a.yaml:3:9: pool.cpus")


def test_no_cpu_left_or_none_named_is_refused():
    with pytest.raises(
        PoolConfigError, match="no CPU left for the pool: the agent may use CPUs 0-1, all reserved"
    ):
        resolve_cpus(None, {0, 1}, {0, 1})
    with pytest.raises(PoolConfigError, match="no CPU named"):
        resolve_cpus([], {0, 1}, ())


def test_the_config_says_where_a_bad_pool_is():
    cfg = parse_config('pool:\n  cpus: "2-3"\n  sliceMs: 5\n', "agent.yaml")
    assert cfg.pool == PoolConfig(cpus=(2, 3), slice_ms=5.0)
    assert cfg.pool.at == "agent.yaml:2:9: pool.cpus"
    assert parse_config("pool: {cpus: auto}\n", "a").pool.cpus is None
    assert parse_config("pool: {}\n", "a").pool == PoolConfig()
    assert parse_config("nodeName: n\n", "a").pool is None
    for text, message in [
        ("pool: {cpu: 1}\n", "a:1:8: unknown field 'pool.cpu' (did you mean 'cpus'?)"),
        ("pool: {cpus: x}\n", "a:1:14: pool.cpus: expected a cpu list"),
        ("pool: {cpus: ''}\n", "a:1:14: pool.cpus: no CPU named"),
        ("pool: {sliceMs: -1}\n", "a:1:17: pool.sliceMs: -1 is out of range 0..10000"),
        ("pool: 3\n", "a:1:7: pool: expected a mapping"),
    ]:
        with pytest.raises(ConfigError) as exc:
            parse_config(text, "a")
        assert message in str(exc.value), text


def test_the_options_override_the_file():
    file = PoolConfig(cpus=(2, 3), slice_ms=5.0, at="a:2:9: pool.cpus")
    assert pool_settings(None, None, None) is None
    assert pool_settings(file, None, None) == file
    assert pool_settings(file, "off", None) is None
    got = pool_settings(file, "1", None)
    assert (got.cpus, got.slice_ms, got.at) == ((1,), 5.0, "--pool")  # the file's slice kept
    assert pool_settings(None, "auto", 0.0) == PoolConfig(cpus=None, slice_ms=0.0)
    assert pool_settings(file, None, 20.0).slice_ms == 20.0
    with pytest.raises(ValueError, match="--pool-slice-ms is for a pool"):
        pool_settings(None, None, 3.0)
    with pytest.raises(ValueError, match="--pool-slice-ms is for a pool, and --pool is off"):
        pool_settings(file, "off", 3.0)
    with pytest.raises(ValueError, match=r"--pool 'x': .*\(off, auto or a cpu list\)"):
        pool_settings(None, "x", None)
    with pytest.raises(ValueError, match="--pool: no CPU named"):
        pool_settings(None, " ", None)
