"""The Ray backend's parts that need no cluster: argument checks, rank grouping by node,
the resource check's words, the TCP transport, and that Ray stays unimported without cluster=.
The launch itself runs on a real two-node cluster in tests/raycluster."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from notebook_launch import LaunchArgumentError, RayCluster, notebook_launcher
from notebook_launch.engines.ray.connect import NodeInfo, check_resources, describe_cluster, host_of
from notebook_launch.engines.ray.gang import assign_ranks, death_reason, visible_devices_by_node
from notebook_launch.channels.sockets import SIGNAL_FRAME, StreamListener, connect_streams
from notebook_launch.errors import GuardError
from notebook_launch.wire.protocol import READY, EventKind, EventReader, EventWriter


def test_nothing_of_ray_is_imported_without_cluster():
    code = ("import sys, notebook_launch\n"
            "from notebook_launch import RayCluster, notebook_launcher\n"
            "RayCluster(resources_per_rank={'GPU': 1}, placement='SPREAD')\n"
            "assert notebook_launcher(lambda: 7, num_processes=1, ui='none') == [7]\n"
            "print(sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, PYTHONPATH=os.getcwd()))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize("kwargs, words", [
    ({"placement": "EVERYWHERE"},
     "RayCluster(placement='EVERYWHERE') is not valid; choose one of 'PACK', 'SPREAD', 'STRICT_SPREAD'"),
    ({"resources_per_rank": {}}, "must be a non-empty dict"),
    ({"resources_per_rank": {"GPU": -1}}, "amounts >= 0; got 'GPU': -1"),
    ({"resources_per_rank": {"CPU": 0}}, "reserves nothing"),
    ({"address": ""}, "address=...) must be 'auto'"),
    ({"runtime_env": "pip"}, "runtime_env=...) must be a dict"),
])
def test_ray_cluster_rejects_bad_fields(kwargs, words):
    with pytest.raises(LaunchArgumentError) as info:
        RayCluster(**kwargs)
    assert words in str(info.value)


@pytest.mark.parametrize("kwargs, words", [
    ({"num_processes": None}, "num_processes must be the total number of ranks"),
    ({"num_processes": 2, "num_nodes": 2}, "leave num_nodes, node_rank and rdzv_endpoint"),
    ({"num_processes": 2, "start_method": "fork"}, "start_method='fork' cannot be combined with cluster="),
])
def test_arguments_a_cluster_launch_cannot_honour(kwargs, words):
    """Refused before Ray is imported or anything connects."""
    with pytest.raises(LaunchArgumentError) as info:
        notebook_launcher(print, cluster=RayCluster(address="10.255.255.1:6379"), **kwargs)
    assert words in str(info.value)


def test_cluster_must_be_a_ray_cluster():
    with pytest.raises(LaunchArgumentError, match="cluster must be a notebook_launch.RayCluster"):
        notebook_launcher(print, num_processes=2, cluster="ray://head:10001")  # type: ignore[arg-type]  # on purpose


def test_ranks_are_grouped_by_node_in_order_of_first_bundle():
    placements = assign_ranks(["b", "a", "b", "a", "c"])
    assert [(p.global_rank, p.bundle, p.node_id, p.node_rank, p.local_rank, p.local_world_size)
            for p in placements] == [
        (0, 0, "b", 0, 0, 2), (1, 2, "b", 0, 1, 2),
        (2, 1, "a", 1, 0, 2), (3, 3, "a", 1, 1, 2),
        (4, 4, "c", 2, 0, 1)]


def test_each_node_sees_its_ranks_gpus_in_local_rank_order():
    placements = assign_ranks(["a", "a", "b"])
    assert visible_devices_by_node(placements, [["3"], ["1"], ["0"]]) == {"a": "3,1", "b": "0"}
    assert visible_devices_by_node(placements, [[], [], []]) == {}


NODES = [NodeInfo("n1", "10.0.0.1", {"CPU": 8, "GPU": 4}), NodeInfo("n2", "10.0.0.2", {"CPU": 8, "GPU": 4})]


@pytest.mark.parametrize("count, resources, placement, words", [
    (16, {"GPU": 1}, "PACK", "16 ranks x 1 GPU requested; the cluster has 8 GPUs on 2 nodes"),
    (4, {"CPU": 12}, "PACK", "48 CPUs"),
    (3, {"CPU": 1}, "STRICT_SPREAD", "at most one rank per node: 3 ranks requested; the cluster has 2 nodes"),
    (2, {"GPU": 1, "TPU": 1}, "PACK", "2 ranks x 1 TPU requested; the cluster has 0 TPU on 2 nodes"),
    (3, {"CPU": 5}, "PACK", "do not fit"),
])
def test_not_enough_resources_says_what_is_missing(count, resources, placement, words):
    with pytest.raises(GuardError) as info:
        check_resources(count, RayCluster(resources_per_rank=resources, placement=placement), NODES)
    text = str(info.value)
    if words == "48 CPUs":
        assert "4 ranks x 12 CPU requested" in text and "each rank needs 12 CPU on one node" not in text
    else:
        assert words in text
    assert "The cluster: 2 nodes, 16 CPUs, 8 GPUs" in text


def test_a_request_that_fits_passes():
    check_resources(8, RayCluster(resources_per_rank={"GPU": 1, "CPU": 2}, placement="PACK"), NODES)
    check_resources(2, RayCluster(placement="STRICT_SPREAD"), NODES)


def test_cluster_words():
    assert describe_cluster(NODES) == "2 nodes, 16 CPUs, 8 GPUs (10.0.0.1: 8 CPU, 4 GPU; 10.0.0.2: 8 CPU, 4 GPU)"
    assert host_of("ray://head:10001") == "head" and host_of("10.1.2.3:6379") == "10.1.2.3"
    assert host_of("auto") is None and host_of(None) is None


def test_death_reasons_name_node_loss_and_crashes():
    assert "node died" in death_reason(RuntimeError("The actor died because its node has died. Node Id: x"))
    assert "unexpectedly" in death_reason(RuntimeError("The actor died unexpectedly before finishing"))
    unavailable = type("ActorUnavailableError", (Exception,), {})
    assert "unreachable" in death_reason(unavailable("The actor is temporarily unavailable: RpcError"))


def test_three_streams_per_rank_over_tcp_and_signals_back():
    """A rank's events, stdout and stderr arrive on the notebook's sockets (in any connection
    order); a signal number travels back on the events connection, an answer on its own."""
    listener = StreamListener("127.0.0.1", world_size=2)
    host, port = listener.address
    received, answers = {}, {}

    def rank(number: int) -> None:
        socks = connect_streams(host, port, listener.token, number)
        EventWriter(socks[0].fileno()).send(READY, {"pid": number, "device": "cpu"})
        socks[1].sendall(f"out {number}\n".encode())
        socks[2].sendall(f"err {number}\n".encode())
        received[number] = socks[0].recv(SIGNAL_FRAME.size)
        answers[number] = b""
        while len(answers[number]) < len("answer 0"):
            answers[number] += socks[3].recv(64)
        for sock in socks:
            sock.close()

    threads = [threading.Thread(target=rank, args=(n,)) for n in (1, 0)]
    for thread in threads:
        thread.start()
    pipes = listener.accept_all(time.monotonic() + 30, check=lambda: None)
    try:
        for number, rank_pipes in enumerate(pipes):
            reader = EventReader()
            events: list[tuple[EventKind, Any]] = []
            while not events:
                events = reader.feed(os.read(rank_pipes.events_r, 1 << 16))
            assert [(kind.value, payload["pid"]) for kind, payload in events] == [("ready", number)]
            assert _read_line(rank_pipes.stdout_r) == f"out {number}\n".encode()
            assert _read_line(rank_pipes.stderr_r) == f"err {number}\n".encode()
            assert rank_pipes.send_signal(signal.SIGTERM)
            os.write(rank_pipes.answers_w, f"answer {number}".encode())
        for thread in threads:
            thread.join(timeout=30)
        assert {n: SIGNAL_FRAME.unpack(data)[0] for n, data in received.items()} == {
            0: signal.SIGTERM, 1: signal.SIGTERM}
        assert answers == {0: b"answer 0", 1: b"answer 1"}
    finally:
        listener.close(keep=pipes)
        for rank_pipes in pipes:
            rank_pipes.close_parent_ends()


def test_a_stranger_without_the_token_is_turned_away():
    listener = StreamListener("127.0.0.1", world_size=1)
    try:
        with socket.create_connection(listener.address) as stranger:
            stranger.sendall(b"x" * 64)
            with pytest.raises(TimeoutError, match=r"ranks \[0\] did not connect back"):
                listener.accept_all(time.monotonic() + 1.0, check=lambda: None)
    finally:
        listener.close()


def _read_line(fd: int) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = os.read(fd, 1 << 16)
        assert chunk, f"EOF after {data!r}"
        data += chunk
    return data


def test_a_raising_call_is_not_called_a_death():
    error_type = type("RayTaskError(ConnectionRefusedError)", (Exception,), {})
    reason = death_reason(error_type("ray::RankActor.run()\n  File x\nConnectionRefusedError: [Errno 111] refused"))
    assert reason == "its Ray actor raised ConnectionRefusedError: [Errno 111] refused"


def test_a_ray_ranks_environment_comes_from_the_one_builder(monkeypatch):
    """A Ray rank's environment is plan.rank_environment's for its place (restart count, max
    restarts, the interface toward the other nodes), with a socket variable the user set kept."""
    from notebook_launch.wire.plan import rank_environment
    from notebook_launch.engines.remote.assignment import RankAssignment
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "users-own")
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    assignment = RankAssignment(global_rank=3, local_rank=1, local_world_size=2, node_rank=1, num_nodes=2,
                                world_size=4, master_addr="10.0.0.1", master_port=29555, device_kind="cpu",
                                mixed_precision="no", run_id="r1", cpu_count=2, interface="eth9",
                                cuda_visible_devices=None, attempt=1, max_restarts=2)
    spec = assignment.spec(os.environ)
    assert RankAssignment.from_json(assignment.to_json()) == assignment   # as SLURM's agents carry it
    expected = rank_environment(global_rank=3, local_rank=1, num_processes=2, num_nodes=2, node_rank=1,
                                world_size=4, master_addr="10.0.0.1", master_port=29555, device_kind="cpu",
                                mixed_precision="no", run_id="r1", user_env={"NCCL_SOCKET_IFNAME": "users-own"},
                                cpu_count=2, restart_count=1, max_restarts=2, interface="eth9")
    assert spec.env == expected
    assert spec.env["TORCHELASTIC_RESTART_COUNT"] == "1" and spec.env["TORCHELASTIC_MAX_RESTARTS"] == "2"
    assert spec.env["GLOO_SOCKET_IFNAME"] == "eth9" and "NCCL_SOCKET_IFNAME" not in spec.env
    assert (spec.global_rank, spec.local_rank, spec.device) == (3, 1, "cpu")
