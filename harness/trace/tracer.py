"""The collective tracer: every point-to-point and collective call a rank makes.

Each call is written as JSON lines to a file descriptor the moment it is entered, waited
on and completed, so whoever reads the other end (the pool's parent, or a file under
``--trace-dir``) knows which call a rank is blocked in while it is still blocked. A call
records its op, its sequence number on its group (collectives) or on its channel (sends
to one peer, receives from one peer), peer, group, shapes, dtype, reduce op and the
user's file:line. Wrapping ``torch.distributed``'s functions (and ``distributed_c10d``'s
own names, which P2POp and batch_isend_irecv compare against) sees every caller that
looks them up at call time: DDP comm hooks, ZeroRedundancyOptimizer, pipelining.
"""

from __future__ import annotations

import inspect
import json
import os
import sys
import threading
import time
import weakref
from types import FrameType
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from distdoctor.models.calls import ASYNC_POINT_TO_POINT, NEW_GROUP, REDUCING, TRACED_OPS
from distdoctor.models.calls import direction as direction_of
from distdoctor.models.events import Ev
from distdoctor.trace.cpuwait import cpu_seconds
from distdoctor.trace.lines import frame_line, where

# frames that are never the user's line: torch, this package's hooks, the standard library
_SKIP_DIRS = (os.path.dirname(torch.__file__), os.path.dirname(os.path.abspath(__file__))
              + os.sep, os.path.dirname(os.__file__))


class Tracer:
    """Install with :meth:`install`; every traced call then writes JSON lines to ``fd``."""

    def __init__(self, fd: int, rank: int):
        self.fd = fd
        self.rank = rank
        self._ids = 0
        self._seq: dict[tuple, int] = {}
        self._lock = threading.Lock()
        self._local = threading.local()
        self._originals: dict[str, Callable] = {}
        self.last_event = self.started = time.monotonic()  # started: the job's start
        self.cpu_at_start = cpu_seconds()  # its threads' time on and waiting for a CPU
        self.optimizer_steps = 0  # kept once count_optimizer_steps ran
        self._counting = False
        self.incomplete_said: set[str] = set()  # evidence already reported as cut short
        self.on_ddp: list[Callable[[Any], None]] = []  # called with each DDP once built
        self.forwarding: Any = None  # the DDP whose training forward is running, if any
        self.trained: Any = None  # a weak reference to the last DDP trained through
        self.jobs = 0  # jobs run on this tracer before the current one (a pool's reset)
        self.optimizer_hook: Any = None  # (handle, hook) of trace/optimizer.py's pre-step hook
        self.phases: Any = None  # trace/phases.py's state, once it records them
        self.ended = False  # trace/jobend.py's job_ended ran for the job under way

    def install(self) -> Tracer:
        global _active
        _active = self
        _patch_work_wait()
        for name in TRACED_OPS:
            original = getattr(c10d, name, None)
            if original is None or name in self._originals:
                continue
            self._originals[name] = original
            wrapped = self._wrap(name, original)
            setattr(c10d, name, wrapped)
            setattr(dist, name, wrapped)
        # DeviceMesh took new_group by name when it was imported: its groups are made there
        mesh = sys.modules.get("torch.distributed.device_mesh")
        if mesh is not None and getattr(mesh, NEW_GROUP, None) is self._originals.get(NEW_GROUP):
            setattr(mesh, NEW_GROUP, getattr(c10d, NEW_GROUP))
        return self

    def reset(self) -> None:
        """Number calls from zero again (every rank does this at the same point)."""
        with self._lock:
            self._ids = 0
            self._seq = {}
            self.optimizer_steps = 0  # a pool's next job numbers its optimiser steps anew
            self.incomplete_said = set()
            self.jobs += 1
            self.started = time.monotonic()
            self.cpu_at_start = cpu_seconds()
            self.ended = False
            hooks = getattr(self, "_step_hooks", None)
            if hooks is not None:
                hooks._decided = -1
                hooks.hook_all(True)  # step 1 is sampled

    def record_ddp_parameters(self) -> None:
        """Make every DistributedDataParallel write down its parameters' names, in the
        order its reducer numbers them, so DDP's "Parameter indices which did not receive
        grad: 2 3" can be read back as names."""
        from torch.nn.parallel import DistributedDataParallel

        original = DistributedDataParallel.__init__
        tracer = self
        self.count_optimizer_steps()

        def init(ddp, module, *args: Any, **kwargs: Any) -> None:
            original(ddp, module, *args, **kwargs)
            try:  # evidence is best effort: never break the user's DDP
                ignored: set[str] = set(getattr(ddp, "parameters_to_ignore", ()) or ())
                names = [n for n, p in module.named_parameters()
                         if p.requires_grad and n not in ignored]
                try:  # the replicas this one averages with: its data-parallel peers
                    group = dist.get_process_group_ranks(ddp.process_group)
                # A group torch cannot name: its DDP replicas are then read from DDP's own calls.
                except Exception:  # noqa: BLE001
                    group = []
                tracer.write(ev=Ev.DDP, t=time.monotonic(), params=names, group=group,
                             where=user_line())
            except Exception as exc:  # noqa: BLE001 (reported as incomplete evidence, below)
                incomplete("DDP's parameter names", exc)
            for hook in tracer.on_ddp:  # other recorders' (buffers.py): best effort too
                try:
                    hook(ddp)
                except Exception as exc:  # noqa: BLE001 (reported as incomplete evidence, below)
                    incomplete("DDP's buffers", exc)

        setattr(DistributedDataParallel, "__init__", init)  # noqa: B010 (a patch)
        forward = DistributedDataParallel.forward

        def traced_forward(ddp, *args: Any, **kwargs: Any) -> Any:
            if not (torch.is_grad_enabled() and ddp.training):
                return forward(ddp, *args, **kwargs)  # evaluation: no backward to sync
            try:
                size = getattr(ddp, "_distdoctor_bytes", None)
                if size is None:
                    size = ddp._distdoctor_bytes = sum(
                        p.numel() * p.element_size() for p in ddp.module.parameters()
                        if p.requires_grad)
                first = first_trainable(ddp)
                tracer.write(ev=Ev.DDP_FORWARD, steps=tracer.optimizer_steps,
                             sync=bool(ddp.require_backward_grad_sync), bytes=size,
                             where=user_line(), t=time.monotonic(),
                             version=None if first is None else first._version)
            # Reported as incomplete evidence, below; evidence is best effort: never break the
            # forward.
            except Exception as exc:  # noqa: BLE001
                incomplete("DDP's forwards", exc)
            tracer.forwarding = ddp  # the module's own hooks run inside: after DDP's sync
            tracer.trained = weakref.ref(ddp)  # the last DDP a training forward ran through
            try:
                return forward(ddp, *args, **kwargs)
            finally:
                tracer.forwarding = None

        setattr(DistributedDataParallel, "forward", traced_forward)  # noqa: B010

    def count_optimizer_steps(self) -> None:
        """Keep ``optimizer_steps``: every optimiser's steps, by a global post-step hook."""
        if self._counting:
            return
        from torch.optim.optimizer import register_optimizer_step_post_hook

        def counted(*_: Any) -> None:
            self.optimizer_steps += 1

        register_optimizer_step_post_hook(counted)
        self._counting = True

    def p2p(self, op: str, peer: int, group: tuple[int, ...]) -> int:
        """Record a send or receive a transport of our own makes (not torch.distributed's),
        numbered on its channel as a traced send or receive is; its id, for mark()."""
        with self._lock:
            self._ids += 1
            key = (direction_of(op), peer, group, None, 0)
            seq = self._seq.get(key, 0)
            self._seq[key] = seq + 1
            call_id = self._ids
        self._put(_enter_line({
            "id": call_id, "t": time.monotonic(), "op": op, "seq": seq, "group": list(group),
            "peer": peer, "peers": [], "shapes": [], "dtype": "", "reduce_op": None,
            "where": user_line(_TRANSPORTS), "rank": self.rank, "async_op": op == "isend"}))
        return call_id

    def write(self, **event: Any) -> None:
        self._put(json.dumps(event, separators=(",", ":")))

    def mark(self, kind: str, call_id: int, where: str | None = None) -> None:
        """The small events of a call (wait, done), formatted without json: they are on the
        hot path of every asynchronous collective."""
        text = f'{{"ev":"{kind}","id":{call_id},"t":{time.monotonic()!r}'
        self._put(text + (f',"where":{_quote(where)}}}' if where is not None else "}"))

    def put(self, line: str) -> None:
        """Write one event already formatted as a JSON object (for the hot paths)."""
        self._put(line)

    def _put(self, line: str) -> None:
        self.last_event = time.monotonic()
        if self.fd < 0:
            return
        try:
            os.write(self.fd, (line + "\n").encode())
        except BrokenPipeError:
            pass  # nobody is listening any more: tracing must never break the job
        except OSError as exc:  # a full disk, a file that refuses writes: say so once
            self.fd = -1
            untraced(f"cannot write the trace ({exc.strerror or exc})")

    def _wrap(self, name: str, original: Callable) -> Callable:
        positional = list(inspect.signature(original).parameters)
        peer_arg, direction = TRACED_OPS[name]

        def traced(*args: Any, **kwargs: Any) -> Any:
            if getattr(self._local, "inside", False):  # e.g. isend inside batch_isend_irecv
                return original(*args, **kwargs)
            try:
                bound = dict(zip(positional, args))
                bound.update(kwargs)
                if name == NEW_GROUP and bound.get("use_local_synchronization"):
                    return original(*args, **kwargs)  # its members alone: no one's sequence
                call = self._describe(name, bound, peer_arg, direction)
                self._put(_enter_line(call))
            # Reported as incomplete evidence, below; arguments we cannot read: torch judges them,
            # not us.
            except Exception as exc:  # noqa: BLE001
                incomplete(f"{name} calls", exc)
                return original(*args, **kwargs)
            self._local.inside = True
            try:
                result = original(*args, **kwargs)
            except BaseException as exc:
                self.write(ev=Ev.ERROR, id=call["id"], t=time.monotonic(), error=repr(exc)[:300])
                raise
            finally:
                self._local.inside = False
            if call["async_op"]:
                _note_works(result, self, call["id"])
            else:
                self.mark(Ev.DONE, call["id"])
            return result

        setattr(traced, "__wrapped__", original)  # noqa: B010 (as functools.wraps sets it)
        traced.__name__ = name
        return traced

    def _describe(self, name: str, bound: dict, peer_arg: str | None,
                  direction: str | None) -> dict:
        if name == "batch_isend_irecv":
            ops = bound.get("p2p_op_list") or []
            tensors = [op.tensor for op in ops]
            group, pg = _group(ops[0].group if ops else None)
            peers = [[direction_of(op.op.__name__), op.peer] for op in ops]
            tags = [getattr(op, "tag", 0) or 0 for op in ops]
            tag = 0  # each op's own, in ``peers``
            peer = None
            key: tuple = ("batch", group, pg)
        else:
            tensors = _tensors(bound)
            group, pg = _group(bound.get("group"))
            peer = bound.get(peer_arg) if peer_arg else None
            if peer is None and peer_arg:  # a rank within the group: name it globally
                local = bound.get("group_" + peer_arg)
                peer = group[local] if isinstance(local, int) and 0 <= local < len(group) \
                    else local
            peers, tags = [], []
            tag = bound.get("tag") or 0 if direction else 0
            key = (direction, peer, group, pg, tag) if direction else ("collective", group, pg)
        op = bound.get("op")
        with self._lock:
            self._ids += 1
            seq = self._seq.get(key, 0)
            self._seq[key] = seq + 1
            call_id = self._ids
            for each, each_tag in zip(peers, tags):  # on their channels, as plain sends
                channel = (each[0], each[1], group, pg, each_tag)
                each.append(self._seq.get(channel, 0))
                self._seq[channel] = each[2] + 1
                if each_tag:
                    each.append(each_tag)
        call = {
            "id": call_id, "t": time.monotonic(), "op": name, "seq": seq, "group": list(group),
            "peer": peer, "peers": peers, "shapes": [list(t.shape) for t in tensors],
            "dtype": str(tensors[0].dtype).removeprefix("torch.") if tensors else "",
            "reduce_op": _op_name(op),
            "where": user_line(), "rank": self.rank,
            "async_op": bool(bound.get("async_op")) or name in ASYNC_POINT_TO_POINT,
        }
        if name == NEW_GROUP:  # the members it makes a group of, in the default group's order
            members = bound.get("ranks")
            call["shapes"] = [sorted(int(r) for r in members) if members is not None
                              else list(group)]
        if name in REDUCING:  # which storage it reduced, after how many optimiser steps
            call["st"] = storages(tensors)
            call["s"] = self.optimizer_steps
        if pg is not None:
            call["pg"] = pg  # another group of the same ranks counts its calls apart
        if tag:
            call["tag"] = tag  # gloo matches a send and a receive by peer and tag
        if threading.current_thread() is not threading.main_thread():
            call["main"] = False  # another thread of this rank may still make any call
        return call


_active: Tracer | None = None
_warned: set[str] = set()


def incomplete(what: str, exc: BaseException) -> None:
    """A recorder failed: its evidence (``what``: "gradient samples", "the batches a
    loader drew", ...) is incomplete from this step on. Said once per kind and job, in
    the trace, so the report names it instead of giving a clean bill of health, and on
    stderr. The user's job goes on: a recorder never breaks a step."""
    tracer = _active
    error = f"{type(exc).__name__}: {exc}"[:300]
    if tracer is not None:
        if what in tracer.incomplete_said:
            return
        tracer.incomplete_said.add(what)
        try:
            tracer.write(ev=Ev.INCOMPLETE, what=what, step=tracer.optimizer_steps + 1,
                         error=error)
        # The trace itself is gone: stderr, below, is all that is left; the trace itself is gone:
        # stderr is all that is left.
        except Exception:  # noqa: BLE001, S110
            pass
    untraced(f"cannot record {what} ({error})")


def untraced(why: str) -> None:
    """Tell the user once, on stderr, that tracing stopped or skipped something; their
    job goes on as if distdoctor were not there."""
    key = why.split(" (")[0]
    if key in _warned:
        return
    _warned.add(key)
    try:
        sys.stderr.write(f"distdoctor: {why}; the job goes on, untraced\n")
        sys.stderr.flush()
    # Stderr is closed: nothing is left to say it with; the user's job goes on.
    except Exception:  # noqa: BLE001, S110
        pass
# the transports' files as a path's tail ("harness/collectives/x.py" in a checkout,
# "distdoctor/collectives/x.py" installed); jobs.py: its argument check
_PACKAGE_DIR = os.path.basename(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_TRANSPORTS = tuple(os.path.join(_PACKAGE_DIR, "collectives", name)
                    for name in ("transport.py", "rendezvous.py", "jobs.py"))


def active() -> Tracer | None:
    """The tracer installed in this process, if any."""
    return _active


# Each asynchronous call's Work handles, weakly: the user and torch keep torch's own object
# (DDP hands its Work to C++, which refuses any stand-in), and a wait on it is seen by the
# one patch of Work.wait below, which looks the handle up here.
_WORKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _note_works(result: Any, tracer: Tracer, call_id: int) -> None:
    """Remember which call each Work of ``result`` belongs to; a handle that cannot be
    held weakly (another backend's own type) is left untraced: its waits go unrecorded."""
    for work in result if isinstance(result, list) else (result,):
        if work is None:
            continue
        try:
            _WORKS[work] = (tracer, call_id)
        except TypeError:
            incomplete("waits on asynchronous calls", TypeError(type(work).__name__))


def _patch_work_wait() -> None:
    """Record a wait on a traced call's Work where the user makes it, and its return, and a
    Work turned into a future (whoever holds the future waits: DDP, for its comm hooks).
    The class's own methods are called through: the object, its type and its results are
    torch's."""
    work_type = getattr(c10d, "Work", None)
    original = getattr(work_type, "wait", None)
    to_future = getattr(work_type, "get_future", None)
    if original is None or getattr(original, "_distdoctor", False):
        return

    def wait(work: Any, *args: Any, **kwargs: Any) -> Any:
        owner = _WORKS.get(work)
        if owner is None:
            return original(work, *args, **kwargs)
        tracer, call_id = owner
        tracer.mark(Ev.WAIT, call_id, user_line())
        result = original(work, *args, **kwargs)
        tracer.mark(Ev.DONE, call_id)
        return result

    def get_future(work: Any, *args: Any, **kwargs: Any) -> Any:
        owner = _WORKS.get(work)
        if owner is not None:
            owner[0].mark(Ev.FUTURE, owner[1])
        assert to_future is not None  # patched only where the class has it
        return to_future(work, *args, **kwargs)

    for name, patched, theirs in (("wait", wait, original), ("get_future", get_future,
                                                            to_future)):
        if theirs is None:
            continue
        setattr(patched, "_distdoctor", True)  # noqa: B010 (patched once per process)
        setattr(patched, "__wrapped__", theirs)  # noqa: B010 (as functools.wraps sets it)
        setattr(work_type, name, patched)


def _tensors(bound: dict) -> list[torch.Tensor]:
    found = []
    for value in bound.values():
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            found.extend(v for v in value if isinstance(v, torch.Tensor))
            found.extend(t for v in value if isinstance(v, (list, tuple))
                         for t in v if isinstance(t, torch.Tensor))
    return found


def storages(tensors: list[torch.Tensor]) -> list[int]:
    """Where each tensor's storage starts: a view of a gradient, or a bucket it is a view
    of, shows the storage it shares. A tensor without one (a subclass, a meta tensor) is
    left out."""
    found = []
    for t in tensors:
        try:
            found.append(t.untyped_storage().data_ptr())
        # No storage to name: nothing is lost but a match.
        except Exception:  # noqa: S112, BLE001, S110
            continue
    return found


def _op_name(op: Any) -> str | None:
    if op is None:
        return None
    return getattr(op, "name", None) or str(op).rsplit(".", 1)[-1]


_GROUPS: dict[int, tuple[tuple[int, ...], str | None]] = {}


def _group(group: Any) -> tuple[tuple[int, ...], str | None]:
    """The group's global ranks, and its name unless it is the default group: two groups
    of the same ranks are different channels, and their calls never pair."""
    try:
        default = c10d._get_default_group()
        group = group or default
        key = id(group)
        if key not in _GROUPS:
            name = None if group is default else str(c10d._get_process_group_name(group))
            _GROUPS[key] = (tuple(dist.get_process_group_ranks(group)), name)
        return _GROUPS[key]
    # A group torch cannot describe: the call is written without its members, which the checks treat
    # as unknown.
    except Exception:  # noqa: BLE001
        return (), None


_quote = json.encoder.encode_basestring  # C-accelerated JSON string quoting


def _enter_line(call: dict) -> str:
    """The enter event as JSON, built by hand: json.dumps costs more than the call."""
    fields = []
    for key, value in call.items():
        if isinstance(value, str):
            text = _quote(value)
        elif value is None:
            text = "null"
        elif isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, (int, float)):
            text = repr(value)
        elif not value:
            text = "[]"
        elif all(type(v) is int for v in value):
            text = "[" + ",".join(map(str, value)) + "]"
        elif all(isinstance(v, list) and all(type(i) is int for i in v) for v in value):
            text = "[" + ",".join("[" + ",".join(map(str, v)) + "]" for v in value) + "]"
        else:
            text = json.dumps(value, separators=(",", ":"))
        fields.append(f'"{key}":{text}')
    return f'{{"ev":"{Ev.ENTER}",' + ",".join(fields) + "}"


def plain_params(optimizer: Any) -> list[torch.Tensor]:
    """The parameters an optimiser steps that are plain tensors: the evidence hooks leave
    sharded ones (DTensor, as FSDP2 makes them) alone, whose every op is a collective."""
    return [p for group in optimizer.param_groups for p in group["params"]
            if type(p) in (torch.nn.Parameter, torch.Tensor) and p.requires_grad]


def user_line(skip: tuple[str, ...] = ()) -> str:
    """file:line of the innermost frame outside torch, the tracer, the stdlib and the
    files ``skip`` names (a transport of our own, for its calls)."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith(_SKIP_DIRS) and not filename.startswith("<") \
                and not filename.endswith(skip):
            return where(filename, frame_line(frame), frame.f_code.co_name)
        frame = frame.f_back
    return ""


def first_trainable(ddp: Any) -> Any:
    """A DDP model's first parameter that takes a gradient (None: it has none), kept
    beside it, never on it (a Parameter set as a module's attribute would become one of
    its parameters). Its ``_version`` (torch's count of in-place changes) tells forwards
    at one set of weights (a step's micro-batches) from forwards with an update between."""
    if ddp not in _FIRST_TRAINABLE:
        _FIRST_TRAINABLE[ddp] = next((p for p in ddp.module.parameters() if p.requires_grad),
                                     None)
    return _FIRST_TRAINABLE[ddp]


_FIRST_TRAINABLE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
