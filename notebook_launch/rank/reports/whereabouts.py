"""Where this rank is, readable by the notebook while the rank is blocked in C (issue 20).

Three things, all installed once per rank by ``install`` (a rank hook), and again in each
process the rank forks (a DataLoader worker), which gets its own:

- **A thread that answers where the rank is** (``where_thread``, issue 31): woken over a pipe
  the notebook writes to, it reads every thread's Python stack under the interpreter lock and
  writes them to its answers memfd. It answers while the main thread waits in a gloo/NCCL
  collective, a lock or ``time.sleep``, with no signal: asking never changes what the rank does.
- **A stack dump on a signal, the fallback** for a rank whose interpreter lock is held by C code
  (no thread can run Python, so the where-thread cannot answer):
  ``faulthandler.register(DUMP_SIGNAL, all_threads=True)`` writes every thread's stack to the
  rank's stacks memfd from inside the signal handler. The notebook sends it only to such a rank,
  and to its where-thread alone (see ``where_thread``). ``DUMP_SIGNAL`` is a realtime signal
  (SIGRTMAX - 2) that no library we know uses, rather than SIGUSR1/2 which users and schedulers
  (SLURM) do use. It is the one deliberate difference from a fresh Python's signal state besides
  faulthandler's crash signals (see tests/test_rank_inherited_state.py). Its default action would
  kill the process, so the notebook sends it only once the record below says it is installed.
- **Collective bookkeeping.** ``torch.distributed``'s collectives (and ``init_process_group``)
  are wrapped: each call writes, into a small memory-mapped record, the operation, its process
  group, its sequence number on that group, the tensors' shapes and dtypes and the calling
  Python frame; on return it clears the "inside" flag. The notebook maps the same file and reads
  it with no help from the rank (a seqlock: the generation counter is odd while a write is under
  way). A few hundred bytes per call; no system call.

The record, the stacks file and the answers are memfds (memory, no path: nothing is left
behind); the notebook opens them through ``/proc/<pid>/fd``, the rank being its child.

What it costs: nothing while no collective runs; per collective, one Python call around torch's
(a dict look-up, a frame walk to the caller, two small writes into the mapped record): about a
microsecond, against tens of microseconds for the smallest gloo all_reduce (measured side by
side by ``benchmarks/collective_bookkeeping.py``; a DDP step's gradient all-reduces run in
torch's C++ reducer and are not wrapped at all); one thread blocked in ``read`` per process.
The same wrapper times each counted collective for the rank's pace (``pace``: two clock reads
and a few additions more, measured by the same benchmark).
``NOTEBOOK_LAUNCH_WHEREABOUTS=0`` in the
notebook's environment (before the launch) leaves all three out: the ranks then cannot say where
they are, and a hang's error says only which ranks were running. ``set_recording`` swaps the
wrappers out and in, for the benchmark.
"""
from __future__ import annotations

import faulthandler
import importlib.abc
import importlib.machinery
import mmap
import os
import signal
import struct
import sys
import threading
from typing import Any, Callable

from ...errors.best_effort import best_effort
from ...wire.fork_locks import ForkRenewedLock
from . import pace, progress
from .pace import Pace
from .where_thread import WhereThread

MAGIC = b"NLWHERE2"
RECORD_SIZE = 4096
# magic (8s), pid (q), main thread ident (Q), dump signal (i), the stacks memfd's fd number (i; 0:
# unknown), the where-thread's answers memfd's fd number (i; 0: none) -> 36 bytes of header;
# then generation (Q), inside (I), text length (I), sequence number (q) at GEN_OFFSET; the text
# (what changes only with the call site, the group or the tensors) at TEXT_OFFSET.
HEADER = struct.Struct("<8sqQiii")
STATE = struct.Struct("=QIIq")   # native order: the rank writes its fields through typed views (Record)
GEN_OFFSET = 40
TEXT_OFFSET = 64
TEXT_LIMIT = RECORD_SIZE - TEXT_OFFSET
FIELD_SEP = "\x1f"   # between the fields of the text: op, group, tensors, file, line, function
DUMP_SIGNAL = int(getattr(signal, "SIGRTMAX", 64)) - 2

# The torch.distributed functions that block until the other ranks of a group take part.
COLLECTIVES = ("all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce",
               "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single",
               "gather", "scatter", "barrier", "monitored_barrier", "send", "recv", "isend", "irecv",
               "all_gather_object", "broadcast_object_list", "gather_object", "scatter_object_list",
               "send_object_list", "recv_object_list", "new_group", "init_process_group",
               "destroy_process_group")


SWITCH = "NOTEBOOK_LAUNCH_WHEREABOUTS"   # "0": no dump handler, no record, no wrapped collectives
# What a rank without a record is said to have done when the switch is off: it may be anywhere (in
# all_reduce, in its own code), so it is never said to have "not started the launched function yet".
SWITCHED_OFF_NOTE = (f"kept no whereabouts record ({SWITCH}=0 leaves that bookkeeping out of the ranks; "
                     f"unset it to see where ranks wait)")


def switched_off() -> bool:
    """Whether ``NOTEBOOK_LAUNCH_WHEREABOUTS=0`` leaves the record out (ranks inherit the notebook's
    environment, so the notebook asks the same question of its own)."""
    return os.environ.get(SWITCH, "1").strip() == "0"
RECORD_NAME = "notebook_launch-whereabouts"   # the memfds' names: the notebook finds them in /proc/<pid>/fd
STACKS_NAME = "notebook_launch-stacks"


class Record:
    """The rank's side of its record: a mapped memfd it writes on every collective. Memory only,
    no path: nothing is left behind when the rank ends, however it ends; the notebook opens it
    through ``/proc/<pid>/fd`` (its own child's)."""

    def __init__(self, name: str = RECORD_NAME) -> None:
        self.fd = os.memfd_create(name)   # the name is how the notebook finds it (/proc/<pid>/fd)
        os.ftruncate(self.fd, RECORD_SIZE)
        self.map = mmap.mmap(self.fd, RECORD_SIZE)
        self.generation = 0
        self.counts: dict[str, int] = {}     # process group's name -> collectives entered on it
        self.names: dict[Any, str] = {}      # process group (None: the default one) -> its name
        self.depth = 0                       # collectives inside collectives (all_gather_object) count once
        self.last_key: Any = None
        self.length = 0
        # STATE's fields as typed views of the mapping: storing an int through a view costs a tenth
        # of a struct.pack_into on the mmap (which takes and releases a buffer each time)
        fields = memoryview(self.map)[GEN_OFFSET:GEN_OFFSET + STATE.size]
        self.gen_word = fields[0:8].cast("Q")
        self.inside_word = fields[8:12].cast("I")
        self.length_word = fields[12:16].cast("I")
        self.seq_word = fields[16:24].cast("q")

    def announce(self, stacks_fd: int = 0, answers_fd: int = 0) -> None:
        """Say the dump handler and the where-thread are installed (written last: the notebook
        asks only after it), and which of the rank's fds their answers go to: a rank may hold
        other memfds of the same name, inherited from whatever forked it, so the notebook never
        goes by the name alone."""
        HEADER.pack_into(self.map, 0, b"\0" * 8, os.getpid(), threading.main_thread().ident or 0, DUMP_SIGNAL,
                         stacks_fd, answers_fd)
        self.map[0:8] = MAGIC

    def enter(self, key: Any, seq: int, describe: Callable[[], str]) -> None:
        """Record a collective: ``seq`` always, the text ``describe()`` only when ``key`` (its
        call site, group and tensors) differs from the last call's, as it rarely does in a loop."""
        self.generation += 1
        self.gen_word[0] = self.generation   # odd: a write is under way (the reader retries)
        if key != self.last_key:
            data = describe().encode("utf-8", "replace")[:TEXT_LIMIT]
            self.map[TEXT_OFFSET:TEXT_OFFSET + len(data)] = data
            self.length = self.length_word[0] = len(data)
            self.last_key = key
        self.inside_word[0] = 1
        self.seq_word[0] = seq
        self.generation += 1
        self.gen_word[0] = self.generation   # even: whole

    def leave(self) -> None:
        self.inside_word[0] = 0   # one aligned word: no tearing to guard


_record: Record | None = None
_pace: Pace | None = None   # the collectives' calls and waits (``pace``), beside the record
_stacks_fd: int | None = None
_where: WhereThread | None = None
_renews_on_fork = False   # the fork hook that gives each forked child its own (registered once)
_installed_by: int | None = None   # the pid that installed them: a forked child has its parent's


def install(spec: Any) -> None:
    """The rank hook: the dump handler, the record, and the wrapped collectives (now if
    torch.distributed is imported already, else as soon as it is). Linux only (memfd, /proc).

    A process forked from one that had them (a rank forked by a process that ran rank code
    itself: a test, a persistent rank's own launch) inherits the parent's record and stacks
    memfd, whose header names the parent's pid: the notebook would never find this rank's.
    Such a child drops the inherited ones and installs its own."""
    with _install_lock:   # XLA runs its ranks as threads of one process: each calls this hook
        _install()


# A child forked while an XLA replica thread installs (a DataLoader started beside it) gets it anew.
_install_lock = ForkRenewedLock()


def _install() -> None:
    global _renews_on_fork
    if _record is not None and _installed_by == os.getpid():
        return
    if not hasattr(os, "memfd_create") or switched_off():
        return
    _own_record()
    if "torch.distributed" in sys.modules:
        wrap_when_used(sys.modules["torch.distributed"])
    elif not any(isinstance(finder, _WrapOnImport) for finder in sys.meta_path):   # one, even after a fork
        sys.meta_path.insert(0, _WrapOnImport())
    if not _renews_on_fork:
        _renews_on_fork = True
        os.register_at_fork(after_in_child=_renew_in_child)


def _own_record() -> None:
    """This process's stacks file, where-thread and record, in place of any it inherited."""
    global _record, _stacks_fd, _installed_by, _where, _pace
    _forget_inherited()
    _stacks_fd = os.memfd_create(STACKS_NAME)
    _installed_by = os.getpid()
    faulthandler.register(DUMP_SIGNAL, file=_stacks_fd, all_threads=True, chain=False)
    _where = WhereThread()
    _record = Record()
    _record.announce(_stacks_fd, _where.answers_fd)
    _pace = Pace(on_first=progress.keep_sending)   # this process's own: a forked child counts afresh
    pace.install(_pace)


def _renew_in_child() -> None:
    """A process the rank forked (a DataLoader worker) answers for itself: its parent's
    where-thread did not survive the fork, and its answers would be the parent's."""
    if _installed_by is None or _installed_by == os.getpid():
        return
    # the child runs without: the notebook then says it could not read it
    with best_effort("a forked child of a rank could not install its where-thread"):
        _own_record()


def _forget_inherited() -> None:
    """Close what a fork inherited from a parent that had installed its own (see ``install``)."""
    global _record, _stacks_fd, _where
    if _where is not None:
        _where.close()
        _where = None
    if _record is not None:
        try:
            _record.map.close()
        except (BufferError, ValueError):   # views of it still held: leave the mapping to the GC
            pass
        _close_quietly(_record.fd)
        _record = None
    if _stacks_fd is not None:
        _close_quietly(_stacks_fd)
        _stacks_fd = None


def _close_quietly(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


class _WrapOnImport(importlib.abc.MetaPathFinder):
    """Wraps torch.distributed's collectives right after the module is first imported."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name != "torch.distributed":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_and_wrap(module: Any) -> None:
            exec_module(module)
            # bookkeeping is a courtesy: torch.distributed works without it
            with best_effort("torch.distributed's collectives were not wrapped"):
                wrap_when_used(module)

        loader.exec_module = exec_and_wrap   # type: ignore[method-assign]
        return spec


_FIRST_GROUP = "_notebook_launch_wraps_collectives"   # marks c10d's ``_update_default_pg`` as ``wrap_when_used``'s


def wrap_when_used(dist: Any) -> None:
    """Wrap what makes and ends process groups now (``UNCOUNTED``: a rank that hangs joining is
    recorded in ``init_process_group``), and the collectives once the first default group comes
    into being: where c10d makes a group the default one (``_update_default_pg``, looked up at
    call time, so every way of calling ``init_process_group`` reaches it, ``init_device_mesh`` and
    a reference taken before the launch too). No collective runs without a default group, so
    every one is recorded as before; a rank that never makes a group (a trivial launch) no longer
    pays for wrapping 23 functions (0.6 ms of each rank's CPU, the pages they touch copied after
    the fork). Wrapped here first, before ``peers_joined`` and ``joining`` wrap some of the same
    names (the rank hooks' order), so theirs stay outside ours, as they were."""
    c10d: Any = getattr(dist, "distributed_c10d", None)
    update = getattr(c10d, "_update_default_pg", None)
    if update is None:   # a torch without it: everything now, as before
        wrap_collectives(dist)
        return
    wrap_collectives(dist, UNCOUNTED)
    if getattr(update, _FIRST_GROUP, False):
        return
    wrapped = False

    def _update_default_pg(pg: Any) -> Any:
        nonlocal wrapped
        if pg is not None and not wrapped:
            wrapped = True
            # bookkeeping is a courtesy: torch.distributed works without it
            with best_effort("torch.distributed's collectives were not wrapped"):
                wrap_collectives(dist, tuple(name for name in COLLECTIVES if name not in UNCOUNTED))
        return update(pg)

    _update_default_pg.__wrapped__ = update   # type: ignore[attr-defined]
    _update_default_pg.__name__, _update_default_pg.__doc__ = update.__name__, update.__doc__
    setattr(_update_default_pg, _FIRST_GROUP, True)
    c10d._update_default_pg = _update_default_pg


def wrap_collectives(dist: Any, names: tuple[str, ...] = COLLECTIVES) -> None:
    """Replace each of ``names`` in ``torch.distributed`` and ``distributed_c10d`` by a recording one."""
    c10d = getattr(dist, "distributed_c10d", None)
    for name in names:
        original = getattr(dist, name, None)
        if original is None or getattr(original, "_notebook_launch_wrapped", False):
            continue
        wrapped = _recording(name, original)
        setattr(dist, name, wrapped)
        if c10d is not None and getattr(c10d, name, None) is original:
            setattr(c10d, name, wrapped)


def set_recording(dist: Any, on: bool) -> None:
    """Put the recording collectives (``on``) or torch's own back into ``torch.distributed``: what
    the bookkeeping costs is measured by turns in one rank (benchmarks/collective_bookkeeping.py)."""
    if on:
        wrap_collectives(dist)
        return
    c10d = getattr(dist, "distributed_c10d", None)
    for name in COLLECTIVES:
        for module in (dist, c10d) if c10d is not None else (dist,):
            current: Any = getattr(module, name, None)
            if getattr(current, "_notebook_launch_wrapped", False):
                setattr(module, name, current.__wrapped__)


def _package_folder() -> str:
    """notebook_launch/ itself, however deep under it this module sits (it moved once)."""
    folder = os.path.abspath(__file__)
    for _ in range(__name__.count(".")):
        folder = os.path.dirname(folder)
    return folder


_SKIP_PREFIXES = (_package_folder(),)


def _caller(frame: Any) -> Any:
    """The first frame outside torch (and us): the user's line that called the collective."""
    while frame is not None:
        filename = frame.f_code.co_filename
        if "/torch/" not in filename and not filename.startswith(_SKIP_PREFIXES):
            return frame
        frame = frame.f_back
    return None


def _describe_tensors(args: tuple, kwargs: dict) -> str:
    parts = []
    for value in args[:2] + tuple(kwargs.values()):
        shape = getattr(value, "shape", None)
        if shape is not None:
            parts.append(f"{tuple(shape)} {str(value.dtype).replace('torch.', '')}")
        elif isinstance(value, list) and value and getattr(value[0], "shape", None) is not None:
            parts.append(f"{len(value)} x {tuple(value[0].shape)} {str(value[0].dtype).replace('torch.', '')}")
    return ", ".join(parts)


def _group_name(dist: Any, group: Any) -> str:
    if group is None or dist is None or group is getattr(getattr(dist, "GroupMember", None), "WORLD", None):
        return "default group"
    try:
        return f"group of ranks {list(dist.get_process_group_ranks(group))}"
    except Exception:   # why: a group torch cannot list is named as a group, no more
        return "a process group"


UNCOUNTED = ("init_process_group", "destroy_process_group", "new_group")   # not numbered on a group


def _recording(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    counted = name not in UNCOUNTED

    def collective(*args: Any, **kwargs: Any) -> Any:
        record = _record
        if record is None or record.depth:
            return original(*args, **kwargs)
        group = kwargs.get("group")
        group_name = record.names.get(group)
        if group_name is None:
            group_name = record.names[group] = _group_name(sys.modules.get("torch.distributed"), group)
        seq = 0
        if counted:
            seq = record.counts.get(group_name, 0) + 1
            record.counts[group_name] = seq
        frame = _caller(sys._getframe(1))
        first = args[0] if args else None
        shape = getattr(first, "shape", None)
        key = (name, group_name, frame.f_code if frame is not None else None,
               frame.f_lineno if frame is not None else 0, shape, getattr(first, "dtype", None), type(first))

        def describe() -> str:
            where = (frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name) if frame is not None \
                else ("", 0, "")
            return FIELD_SEP.join((name, group_name, _describe_tensors(args, kwargs),
                                   where[0], str(where[1]), where[2]))

        # the pace first: its first call starts the progress thread, which must be done before the
        # record says "inside" (a test, or a rank, that acts on that expects the rank in torch's call)
        counter = _pace if counted else None
        entered = counter.enter(name) if counter is not None else 0.0
        record.enter(key, seq, describe)
        record.depth += 1
        try:
            return original(*args, **kwargs)
        finally:
            record.depth -= 1
            record.leave()
            if counter is not None:
                counter.leave(name, entered)

    return marked_wrapper(collective, original, name)


def marked_wrapper(wrapper: Callable[..., Any], original: Callable[..., Any], name: str) -> Callable[..., Any]:
    """``wrapper`` named as ``original``, which it keeps as ``__wrapped__`` (``set_recording`` puts it
    back), and marked as ours so that a collective is never wrapped twice."""
    wrapper.__wrapped__ = original   # type: ignore[attr-defined]
    wrapper.__name__ = getattr(original, "__name__", name)
    wrapper.__qualname__ = getattr(original, "__qualname__", name)
    wrapper.__doc__ = getattr(original, "__doc__", None)
    wrapper._notebook_launch_wrapped = True   # type: ignore[attr-defined]
    return wrapper
