"""Accelerate-style rendezvous arguments -> what elastic's rendezvous is given."""
import pytest

from notebook_launch.planning import net as network
from notebook_launch.errors import LaunchArgumentError
from notebook_launch.engines.elastic.rendezvous import settings_for
from notebook_launch.planning.options import DEFAULT_RDZV_TIMEOUT, launch_options


def settings(**overrides):
    """What a launch's arguments (checked once by launch_options) give elastic's rendezvous."""
    args = dict(rdzv_backend="static", rdzv_endpoint="", rdzv_conf=None, rdzv_id="none",
                rdzv_timeout=None, master_addr="10.0.0.5", node_rank=1, num_nodes=2)
    args.update(overrides)
    return settings_for(launch_options(function=print, **args), port=29501)


def test_static_uses_master_addr_port_and_node_rank_like_accelerate():
    s = settings()
    assert s.endpoint == "10.0.0.5:29501"
    assert s.config == {"rank": 1, "timeout": int(DEFAULT_RDZV_TIMEOUT)}
    assert s.timeout == DEFAULT_RDZV_TIMEOUT == 900


def test_timeout_comes_from_rdzv_timeout_then_rdzv_conf():
    conf = {"join_timeout": 30}
    assert settings(rdzv_conf=conf).timeout == 30
    assert settings(rdzv_conf=conf, rdzv_timeout=5).timeout == 5
    assert conf == {"join_timeout": 30}, "the caller's rdzv_conf must not be changed"


def test_c10d_gets_join_timeout_and_knows_a_loopback_endpoint_is_hosted_here():
    s = settings(rdzv_backend="c10d", master_addr="127.0.0.1", rdzv_timeout=12)
    assert s.config["join_timeout"] == 12
    assert s.is_host is True and s.local_addr is None
    assert settings(rdzv_backend="c10d", rdzv_endpoint="192.0.2.1:1234").is_host is False


@pytest.mark.parametrize("bad", [{"rdzv_conf": "join_timeout=5"}, {"rdzv_timeout": 0},
                                 {"rdzv_timeout": "10"}, {"rdzv_id": ""}, {"rdzv_endpoint": 5},
                                 {"rdzv_conf": {"timeout": "soon"}}])
def test_bad_arguments_name_the_argument(bad):
    with pytest.raises(LaunchArgumentError) as info:
        settings(**bad)
    assert next(iter(bad)) in str(info.value)


def test_network_facts_on_loopback():
    assert network.interface_toward("127.0.0.1") == "lo"
    assert network.is_local_address("127.0.0.1")
    assert not network.is_local_address("192.0.2.1")   # TEST-NET-1: never assigned
