"""Results of every shape and size come back as a plain pickle round trip brings them (issue 32
item 5), from a launch (fork and spawn) and from persistent ranks, and arguments go the same way.

- Identity and sharing: what the rank shared is shared here (``[a, a]`` is one list twice), and
  cycles come back as cycles, through lists, dicts, OrderedDicts, defaultdicts, deques, sets,
  frozensets, tuples and objects; a
  tensor found twice is one tensor, views of one storage share one, a numpy array found twice
  is one array. (A rank used to rebuild the containers before pickling: a cycle was refused
  as RecursionError and ``[a, a]`` came back as two lists.)
- numpy arrays of every dtype (every int and uint width, floats, complex, long double, datetime,
  timedelta, bytes, str, void, byte-swapped, structured, nested and aligned structured, object,
  numpy 2's variable-width strings), a pandas DataFrame,
  shape (0-d, empty, F-ordered) and layout (strided, transposed, reversed, broadcast, read-only)
  come back as pickle brings them; the big ones through the result file's pages, mapped, not
  copied through a pipe.
- Sizes: a big ``bytes``, ``bytearray`` and ``str`` and a long list, through the result file
  (the event pipe then carries a few bytes), and through the event pipe where there is no result
  file (``ulimit -f`` caps it: the rank sets RLIMIT_FSIZE). The frame header is 64 bits: a frame
  over 4 GiB (tested on the codec here; this machine cannot afford a 4 GiB result in a test)
  cannot overflow it.
- A memoryview comes back as its bytes (cloudpickle's way); what cannot be pickled at all is
  refused naming its path, after big parts went to the result file.
- Out of memory writing a result in the rank or loading it in the notebook: a result failure
  that says so and what to do, not "cannot be pickled" nor a crash.
- Spawned ranks' arguments, and persistent ranks' (local and Ray's wire), go the same way.
"""
from __future__ import annotations

import collections
import dataclasses
import os
import pickle
import resource
import signal
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch

from notebook_launch import LaunchError, notebook_launcher, start_ranks
from notebook_launch.wire import protocol, shared_tensors
from notebook_launch.planning.net import free_port
from notebook_launch.channels import commands
from notebook_launch.persistent import command_frames

pytestmark = pytest.mark.timeout(300)
N = 1 << 17   # elements: 128 KiB even for one-byte dtypes, above shared_tensors.INLINE_LIMIT


# --- identity and sharing ----------------------------------------------------------------------

class Node:
    """An object that can hold itself."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.links: list = []


@dataclasses.dataclass(eq=False)
class Holder:
    """Hashable by identity: it can sit in a set that it holds."""
    members: set


def shared_and_cyclic() -> dict:
    a = [1, 2]
    d = {"k": "v"}
    cyclic_list: list = [0]
    cyclic_list.append(cyclic_list)
    cyclic_dict: dict = {}
    cyclic_dict["me"] = cyclic_dict
    ordered: collections.OrderedDict = collections.OrderedDict()
    ordered["me"] = ordered
    node = Node("n")
    node.links += [node, Node("other")]
    node.links[1].links.append(node)
    members: set = set()
    members.add(Holder(members))
    tuple_list: list = []
    tup = (tuple_list, 1)
    tuple_list.append(tup)
    frozen_holder = Node("frozen")
    frozen = frozenset([frozen_holder])
    frozen_holder.links.append(frozen)
    queue: collections.deque = collections.deque([1])
    queue.append(queue)
    by_default: collections.defaultdict = collections.defaultdict(list)
    by_default["me"].append(by_default)
    t = torch.arange(float(N))
    array = np.arange(N, dtype=np.float32)
    return {"a twice": [a, a], "a again": a, "d twice": (d, d), "cyclic list": cyclic_list,
            "cyclic dict": cyclic_dict, "ordered": ordered, "node": node, "set": members, "tuple": tup,
            "frozenset": frozen, "deque": queue, "defaultdict": by_default,
            "tensor twice": [t, t], "tensor again": t, "view": t[10:], "small tensor twice": [t[:3].clone()] * 2,
            "array twice": [array, array], "array again": array, "small array twice": [np.zeros(3)] * 2,
            "holder twice": [next(iter(members))] * 2}


def assert_shared_and_cyclic(got: dict) -> None:
    assert got["a twice"][0] is got["a twice"][1] is got["a again"] and got["a again"] == [1, 2]
    assert got["d twice"][0] is got["d twice"][1]
    assert got["cyclic list"][1] is got["cyclic list"] and got["cyclic list"][0] == 0
    assert got["cyclic dict"]["me"] is got["cyclic dict"]
    assert type(got["ordered"]) is collections.OrderedDict and got["ordered"]["me"] is got["ordered"]
    node = got["node"]
    assert isinstance(node, Node) and node.links[0] is node and node.links[1].links[0] is node
    [holder] = got["set"]
    assert holder.members is got["set"] and got["holder twice"][0] is got["holder twice"][1] is holder
    assert got["tuple"][0][0] is got["tuple"] and got["tuple"][1] == 1
    [frozen_holder] = got["frozenset"]
    assert type(got["frozenset"]) is frozenset and frozen_holder.links[0] is got["frozenset"]
    assert type(got["deque"]) is collections.deque and got["deque"][1] is got["deque"]
    assert type(got["defaultdict"]) is collections.defaultdict and got["defaultdict"]["me"][0] is got["defaultdict"]
    t = got["tensor again"]
    assert got["tensor twice"][0] is got["tensor twice"][1] is t and torch.equal(t, torch.arange(float(N)))
    assert got["view"].untyped_storage().data_ptr() == t.untyped_storage().data_ptr()
    assert got["small tensor twice"][0] is got["small tensor twice"][1]
    array = got["array again"]
    assert got["array twice"][0] is got["array twice"][1] is array
    assert np.array_equal(array, np.arange(N, dtype=np.float32))
    assert got["small array twice"][0] is got["small array twice"][1]
    array[0] = -1.0   # one array: a write shows through both places
    assert got["array twice"][1][0] == -1.0


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_shared_and_cyclic_values_come_back_shared_and_cyclic(start_method, log_dir):
    [got] = notebook_launcher(shared_and_cyclic, num_processes=1, start_method=start_method,
                              use_port=str(free_port()), log_dir=log_dir, ui="none", timeout=240)
    assert_shared_and_cyclic(got)


# --- numpy arrays of every dtype, shape and layout ------------------------------------------------

STRUCTURED = np.dtype([("id", "<i8"), ("pos", "<f4", (3,)), ("name", "S6"),
                       ("inner", [("a", "u1"), ("b", ">i2")])])
ALIGNED = np.dtype([("flag", "u1"), ("value", "<f8"), ("code", "<i2")], align=True)


def numpy_kinds() -> dict:
    rng = np.random.default_rng(0)
    kinds: dict = {}
    for dtype in ("?", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f2", "f4", "f8", "g", "c8", "c16",
                  "G", "M8[ns]", "m8[s]", "S7", "U3", "V5", ">i4", ">f8", ">c8"):
        raw = rng.integers(0, 250, size=N * np.dtype(dtype).itemsize, dtype=np.uint8)
        kinds[f"dtype {dtype}"] = raw.view(dtype)
        kinds[f"small {dtype}"] = raw[:4 * np.dtype(dtype).itemsize].view(dtype)   # inline in the stream
    kinds["nan floats"] = np.full(N, np.nan)
    for name, record in (("structured", STRUCTURED), ("aligned structured", ALIGNED)):
        records = np.zeros(N, dtype=record)
        for field in record.names or ():
            records[field] = 7
        kinds[name] = records
    with_objects = np.zeros(N // 16, dtype=[("n", "i4"), ("o", "O")])
    with_objects["o"] = [{"i": i} for i in range(N // 16)]
    kinds["structured with objects"] = with_objects
    kinds["object"] = np.array([{"a": 1}, None, "x", 3.5] * (N // 4), dtype=object)
    base = np.arange(N * 4, dtype=np.float64).reshape(512, -1)
    kinds.update({
        "0-d": np.array(3.5), "0-d uint64": np.array(2 ** 64 - 1, dtype="u8"),
        "0-d structured": np.zeros((), dtype=STRUCTURED), "0-d object": np.array({"a": 1}, dtype=object),
        "empty": np.empty((0, 5)), "empty str": np.empty((3, 0), dtype="U2"), "zero-size dtype": np.zeros(4, "V0"),
        "2-d": base, "F-ordered": np.asfortranarray(base), "transposed": base.T, "strided": base[::3, 1::2],
        "reversed": base[::-1], "broadcast (read-only)": np.broadcast_to(base[0], (300, base.shape[1])),
        "read-only": base.copy(), "3-d F-ordered": np.asfortranarray(base.reshape(64, 8, -1)),
        "masked": np.ma.masked_array(base[:64], mask=base[:64] % 3 == 0),
        "scalar float64": np.float64(2.5), "scalar datetime": np.datetime64("2026-11-26T17:00"),
    })
    kinds["read-only"].flags.writeable = False
    if hasattr(np.dtypes, "StringDType"):   # numpy 2: its buffer holds pointers, so through pickle
        kinds["variable-width strings"] = np.array(["abc", "a string longer than a pointer or two"] * (N // 8),
                                                   dtype=np.dtypes.StringDType())
    return kinds


def a_data_frame():
    """What a rank often returns: a DataFrame (its columns are numpy arrays, and pandas' own)."""
    import pandas as pd
    return pd.DataFrame({"x": np.arange(float(N)), "n": np.arange(N), "s": ["a", "b"] * (N // 2),
                         "c": pd.Categorical(["u", "v"] * (N // 2))})


def assert_pickle_equal(name: str, got, want) -> None:
    """``got`` is what a plain pickle round trip of ``want`` gives: class, dtype, shape, strides,
    writability and every byte (object arrays: every element)."""
    expected = pickle.loads(pickle.dumps(want, protocol=pickle.HIGHEST_PROTOCOL))
    assert type(got) is type(expected), name
    if not isinstance(expected, np.ndarray):
        assert got == expected, name
        return
    assert got.dtype == expected.dtype and got.shape == expected.shape, name
    assert got.strides == expected.strides, name
    assert got.flags.writeable == expected.flags.writeable, name
    if isinstance(expected, np.ma.MaskedArray):
        assert np.array_equal(got.mask, expected.mask), name
    if expected.dtype.hasobject:
        assert got.tolist() == expected.tolist(), name
    else:
        assert got.tobytes(order="A") == expected.tobytes(order="A"), name


def mapped_from_result_file(array: np.ndarray) -> bool:
    """Whether ``array``'s bytes are pages of a result file mapped here (not a copy)."""
    address = array.__array_interface__["data"][0]
    with open("/proc/self/maps") as f:
        for line in f:
            if "notebook_launch-tensors" in line:
                start, end = (int(part, 16) for part in line.split()[0].split("-"))
                if start <= address < end:
                    return True
    return False


def returns_numpy_kinds() -> dict:
    return {**numpy_kinds(), "data frame": a_data_frame()}


def test_numpy_arrays_of_every_dtype_shape_and_layout_come_back_as_pickle_brings_them(log_dir):
    [got] = notebook_launcher(returns_numpy_kinds, num_processes=1, use_port=str(free_port()),
                              log_dir=log_dir, ui="none", timeout=240)
    assert got.pop("data frame").equals(a_data_frame())
    want = numpy_kinds()
    assert set(got) == set(want)
    for name in want:
        assert_pickle_equal(name, got[name], want[name])
    # the big plain arrays are the result file's pages, mapped here
    for name in ("dtype f8", "dtype V5", "structured", "aligned structured", "2-d", "F-ordered", "transposed"):
        assert mapped_from_result_file(got[name]), name
    assert not mapped_from_result_file(got["object"]) and not mapped_from_result_file(got["small f8"])
    # writable and private: a write changes the notebook's copy only, and stays in its place
    got["2-d"][0, 1] = -5.0
    assert got["2-d"][0, 1] == -5.0 and got["F-ordered"][0, 1] == 1.0
    del got
    import gc
    gc.collect()
    with open("/proc/self/maps") as f:   # once the arrays are gone, so are their mappings
        assert not [line for line in f if "notebook_launch-tensors" in line]


# --- sizes ---------------------------------------------------------------------------------------

BIG_BYTES = 24 << 20


class FortranOrderedBuffer:
    """Pickled as a PickleBuffer over F-ordered memory (contiguous, but not in C order), which
    pickle writes in band as its raw bytes: it comes back as a bytearray of them."""

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def __reduce_ex__(self, protocol):
        return bytearray, (pickle.PickleBuffer(self.array),)   # type: ignore[arg-type]  # numpy stubs lack __buffer__


def big_values() -> dict:
    blob = bytes(range(256)) * (BIG_BYTES // 256)
    return {"bytes": blob, "bytearray": bytearray(blob[: 3 << 20]), "str": "žluťoučký kůň " * (1 << 19),
            "long list": list(range(2_000_000)), "array": np.arange(N, dtype=np.int64),
            "tensor": torch.arange(N), "small": b"abc", "tail": "the stream goes on after the big parts",
            "F-ordered buffer": FortranOrderedBuffer(np.asfortranarray(np.arange(N * 2.0).reshape(512, -1)))}


def assert_big_values(got: dict) -> None:
    want = big_values()
    assert set(got) == set(want)
    for name in ("bytes", "bytearray", "str", "long list", "small", "tail"):
        assert type(got[name]) is type(want[name]) and got[name] == want[name], name
    assert np.array_equal(got["array"], want["array"]) and torch.equal(got["tensor"], want["tensor"])
    expected = pickle.loads(pickle.dumps(want["F-ordered buffer"], protocol=pickle.HIGHEST_PROTOCOL))
    assert type(got["F-ordered buffer"]) is bytearray and got["F-ordered buffer"] == expected


def returns_big_values() -> dict:
    return big_values()


def returns_big_values_without_a_result_file() -> dict:
    """``ulimit -f`` caps the result file (a memfd) too: everything crosses the event pipe."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # the write fails with EFBIG instead of killing us
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    return big_values()


@pytest.mark.parametrize("function", [returns_big_values, returns_big_values_without_a_result_file],
                         ids=["result file", "event pipe"])
def test_big_bytes_str_and_lists_come_back(function, log_dir):
    [got] = notebook_launcher(function, num_processes=1, use_port=str(free_port()), log_dir=log_dir,
                              ui="none", timeout=240)
    assert_big_values(got)


def test_values_pickled_through_a_pickle_buffer_are_not_called_unpicklable():
    """The probe that finds what cannot be sent (spawn arguments, a result's failing part, the
    names a ``%%ranks`` cell sends) pickles into a sink: a big PickleBuffer written whole is
    fine there, as in pickle (it was refused with "PickleBuffer has no len()")."""
    from notebook_launch.wire import pickling
    from notebook_launch.rank import namespace
    values = {"C-ordered": FortranOrderedBuffer(np.zeros(N)), "F-ordered": big_values()["F-ordered buffer"],
              "buffer": pickle.PickleBuffer(bytearray(N)), "array": np.zeros(N)}
    for name, value in values.items():
        assert pickling.pickle_error(value) is None, name
        assert pickling.locate(value, name) is None, name
    assert namespace.unpicklable(values) == {}


def test_a_big_stream_goes_to_the_file_and_the_frame_stays_small():
    """In one process: a big bytes, str or list pickles into the file; what goes on the pipe is
    a few hundred bytes, whatever the value's size; and the stream's pages are freed once read."""
    fd = shared_tensors.create_file()
    assert fd is not None
    try:
        for value in (b"x" * (8 << 20), "y" * (8 << 20), list(range(3_000_000)), [np.zeros(N)] * 3):
            size_before = os.fstat(fd).st_size
            data = shared_tensors.dumps(value, fd)
            assert len(data) < 4096 and os.fstat(fd).st_size - size_before >= 1 << 20
            back = shared_tensors.loads(data, fd, discard_stream=True)
            assert type(back) is type(value) and len(back) == len(value)
        assert allocated_bytes(fd) < 8 << 20   # the streams' pages went; the array (1 MiB) stays
    finally:
        os.close(fd)


def allocated_bytes(fd: int) -> int:
    return os.fstat(fd).st_blocks * 512


@pytest.mark.parametrize("size", [0, 1, 2 ** 31, 2 ** 32 - 1, 2 ** 32, 2 ** 32 + 7, 2 ** 40])
def test_frame_headers_hold_any_size(size):
    """A frame's header is 64 bits (a 4 GiB payload crashed the rank with struct.error): each
    size encodes and decodes as itself, and a reader given the header of a frame over 4 GiB waits
    for all of it instead of reading a short frame."""
    for header in (protocol._HEADER, commands.HEADER):
        assert header.unpack(header.pack(size)) == (size,)
    reader = protocol.EventReader()
    if size > 64:
        assert reader.feed(protocol._HEADER.pack(size) + b"\x80" * 64) == []


def test_frames_cross_a_real_pipe_whole():
    """Frames of several sizes, through a real pipe read in the supervisor's chunks: each comes
    out whole and equal, however the reads cut them."""
    read_fd, write_fd = os.pipe()
    payloads = [b"", b"a", os.urandom(70_000), os.urandom(9 << 20), "é" * 100_000]
    writer = protocol.EventWriter(write_fd)

    def send_all() -> None:
        for payload in payloads:
            writer.send(protocol.RESULT, payload)

    sender = threading.Thread(target=send_all)
    sender.start()
    reader = protocol.EventReader()
    events: list = []
    while len(events) < len(payloads):
        events += reader.feed(os.read(read_fd, 1 << 16))
    sender.join()
    os.close(read_fd)
    os.close(write_fd)
    assert [payload for _, payload in events] == payloads


def returns_more_than_memory_allows() -> bytes:
    """No result file (``ulimit -f``) and too little address space left to pickle the value."""
    value = b"x" * (64 << 20)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    with open("/proc/self/status") as f:
        used = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    resource.setrlimit(resource.RLIMIT_AS, (used + (32 << 20), resource.getrlimit(resource.RLIMIT_AS)[1]))
    return value


def test_a_result_that_does_not_fit_in_memory_is_a_result_failure_that_says_so(log_dir):
    """Out of memory while pickling the result: the rank reports it as such (not as a value that
    "cannot be pickled", nor as a crash with notebook_launch's traceback)."""
    with pytest.raises(LaunchError) as caught:
        notebook_launcher(returns_more_than_memory_allows, num_processes=1, use_port=str(free_port()),
                          log_dir=log_dir, ui="none", timeout=240)
    message = str(caught.value)
    assert caught.value.kind == "result" and "could not send its result: it ran out of memory" in message, message
    assert "MemoryError" in message and "return less" in message and "cannot be pickled" not in message, message


NOTEBOOK_SHORT_OF_MEMORY = """
import os, resource, sys
from notebook_launch import LaunchError, notebook_launcher
from notebook_launch.planning.net import free_port

def cap_the_notebook_then_return_more():
    with open(f"/proc/{os.getppid()}/status") as f:
        used = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    resource.prlimit(os.getppid(), resource.RLIMIT_AS, (used + (16 << 20), resource.RLIM_INFINITY))
    return b"x" * (256 << 20)

try:
    notebook_launcher(cap_the_notebook_then_return_more, num_processes=1, use_port=str(free_port()),
                      log_dir=sys.argv[1], ui="none", timeout=240)
except LaunchError as exc:
    print("KIND", exc.kind)
    print(exc)
"""


def test_a_result_that_does_not_fit_in_the_notebook_says_so(log_dir):
    """The notebook short of memory to load a result (the rank caps the notebook's address space
    before it returns): a result failure that says so, not a value that "could not be unpickled"."""
    done = subprocess.run([sys.executable, "-c", NOTEBOOK_SHORT_OF_MEMORY, log_dir], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "KIND result" in done.stdout, done.stdout
    assert "does not fit in the notebook's memory" in done.stdout and "return less" in done.stdout, done.stdout


def returns_memoryviews() -> dict:
    grid = np.arange(N, dtype=np.int32).reshape(256, -1)
    return {"small": memoryview(b"abc"), "big": memoryview(bytes(range(256)) * (BIG_BYTES // 256)),
            "of an array": memoryview(grid.data), "strided": memoryview(grid.data)[::2], "ok": 1}


def test_memoryviews_come_back_as_their_bytes(log_dir):
    """Plain pickle refuses a memoryview; cloudpickle (what ranks pickle with) sends its bytes."""
    [got] = notebook_launcher(returns_memoryviews, num_processes=1, use_port=str(free_port()), log_dir=log_dir,
                              ui="none", timeout=240)
    want = returns_memoryviews()
    for name in ("small", "big", "of an array", "strided"):
        assert type(got[name]) is bytes and got[name] == want[name].tobytes(), name
    assert got["ok"] == 1


def returns_a_lock() -> dict:
    return {"ok": 1, "nested": [b"x" * BIG_BYTES, {"lock": threading.Lock()}]}


def test_what_cannot_be_pickled_is_refused_naming_its_path(log_dir):
    """Refused naming the part, though big parts before it had gone to the result file."""
    with pytest.raises(LaunchError) as caught:
        notebook_launcher(returns_a_lock, num_processes=1, use_port=str(free_port()), log_dir=log_dir,
                          ui="none", timeout=240)
    assert "result['nested'][1]['lock'] (_thread.lock)" in str(caught.value) and caught.value.kind == "result"


def test_spawned_ranks_get_arguments_of_every_shape_and_send_them_back(log_dir):
    """Arguments go the same way to spawned ranks (one file read by every rank: neither may free
    what the other still reads), and come back from each."""
    value = {**shared_and_cyclic(), **big_values(), "arrays": numpy_kinds()}
    want = numpy_kinds()
    results = notebook_launcher(echo_with_identity, args=(value,), num_processes=2, start_method="spawn",
                                use_port=str(free_port()), log_dir=log_dir, ui="none", timeout=240)
    for got in results:
        assert got["shared"] and got["cyclic"]
        assert_shared_and_cyclic(got["value"])
        assert_big_values({name: got["value"][name] for name in big_values()})
        for name in want:
            assert_pickle_equal(name, got["value"]["arrays"][name], want[name])


# --- persistent ranks: results and arguments both ways ------------------------------------------

def echo_with_identity(value: dict) -> dict:
    """What a rank got, back, with whether its sharing arrived."""
    return {"value": value, "shared": value["a twice"][0] is value["a twice"][1],
            "cyclic": value["cyclic list"][1] is value["cyclic list"]}


def test_persistent_ranks_send_and_return_every_shape(log_dir):
    with start_ranks(2, ui="none", log_dir=log_dir, use_port=free_port()) as ranks:
        for got in ranks.run(shared_and_cyclic):
            assert_shared_and_cyclic(got)
        for got in ranks.run(returns_big_values):
            assert_big_values(got)
        want = numpy_kinds()
        for got in ranks.run(returns_numpy_kinds):
            assert got.pop("data frame").equals(a_data_frame())
            for name in want:
                assert_pickle_equal(name, got[name], want[name])
        value = {**shared_and_cyclic(), **big_values(), "arrays": numpy_kinds()}
        for got in ranks.run(echo_with_identity, args=(value,)):
            assert got["shared"] and got["cyclic"]
            assert_shared_and_cyclic(got["value"])
            assert_big_values({name: got["value"][name] for name in big_values()})
            for name in want:
                assert_pickle_equal(name, got["value"]["arrays"][name], want[name])


# --- persistent Ray ranks' wire: the call's frame and its file cross a socket whole ---------------

def test_a_ray_call_of_every_shape_crosses_the_wire():
    """A CALL whose stream went to its file (a big bytes, str and list) and whose arrays did too
    crosses to a Ray rank as ``engines.remote.persistent`` sends it and ``engines.remote.serve`` reads it (a
    real socket pair; no cluster needed): the rank's file gets the same offsets."""
    import socket

    from notebook_launch.engines.remote.persistent import call_message, write_whole
    from notebook_launch.engines.remote import serve as ray_serve
    from notebook_launch.rank.runner import Job
    from notebook_launch.rank.serve import Call

    notebook_end, rank_end = socket.socketpair()
    os.set_blocking(notebook_end.fileno(), False)
    finished = threading.Event()
    inbox = ray_serve.listen(rank_end, finished)
    value = {**shared_and_cyclic(), **big_values(), "arrays": numpy_kinds()}
    frame = command_frames.encode(commands.Command.CALL, Call(Job(echo_with_identity, (value,)), number=3))
    try:
        assert frame.tensors is not None and len(frame.data) < 4096   # the stream is in the file
        with call_message(frame) as parts:
            write_whole(notebook_end.fileno(), parts)
    finally:
        frame.close()
    received = inbox.calls.get(timeout=60)
    assert received is not None
    kind, call = ray_serve.decode(*received)
    assert kind == "call" and call.number == 3
    got = call.job.function(*call.job.args)
    assert got["shared"] and got["cyclic"]
    assert_shared_and_cyclic(got["value"])
    assert_big_values({name: got["value"][name] for name in big_values()})
    want = numpy_kinds()
    for name in want:
        assert_pickle_equal(name, got["value"]["arrays"][name], want[name])
    finished.set()
    notebook_end.close()
    assert inbox.calls.get(timeout=30) is None
    rank_end.close()
