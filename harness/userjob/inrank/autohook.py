"""Inside every Python process of a command run by ``distdoctor run -- COMMAND``: trace the
ones that become ranks.

``distdoctor run --`` puts a folder holding only a ``sitecustomize.py`` (``write_hook``)
first on PYTHONPATH, so every Python the command starts, by whatever launcher (torchrun,
``mp.spawn``, a plain ``multiprocessing.Process``, a shell loop), calls :func:`install` as
it starts. That costs
one entry on ``sys.meta_path`` and nothing else: no torch, no thread. Only when the process
imports ``torch.distributed`` is ``init_process_group`` wrapped, and only when it returns
does the process become a traced rank, numbered by its rank in the default group: its
calls to ``rank-<RANK>.jsonl``, its stacks to ``rank-<RANK>.stacks`` (on a stall, on
SIGUSR1, on a fatal signal), its end (finished, raised with the traceback, exited with a
code), exactly as ``python -m distdoctor.userjob --trace-dir`` writes them, so the same
reader (traces.py) and the same report serve both.

Several process groups over a command's life (``init_process_group`` after a
``destroy_process_group``, an ``mp.spawn`` in a loop) are told apart without any message
between the ranks: each group's ranks share a rendezvous (``env://`` address and port,
``tcp://`` or ``file://`` URL, or store) and leave ``init_process_group`` together; a rank
joins the first directory of its rendezvous and world size that has no trace of its rank
yet, is not full and was opened within the last minute, else opens the next
(``pg-<rendezvous>-<n>``). The directory's name is the run id every trace opens with.

The exceptions a launcher catches before Python would print them (``mp.spawn``'s child
wrapper sends the traceback to its parent, which raises ``ProcessExitedException``;
``multiprocessing.Process`` prints it and exits 1) are noted in the rank's trace on their
way out, so the report shows the rank's own traceback, not the launcher's.
"""

from __future__ import annotations

import atexit
import hashlib
import importlib.abc
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

from distdoctor.models import deadlines

HOOK_DIR = "DISTDOCTOR_HOOK_DIR"  # where traces go; set by ``distdoctor run --`` only
HOOK_DEADLINE = "DISTDOCTOR_HOOK_DEADLINE"  # seconds without a call before a rank stalls
HOOK_LIGHT = "DISTDOCTOR_HOOK_LIGHT"  # "1": calls only, not the silent bugs' evidence
OPENED = "opened"  # a file in a group's directory, made by its first rank
JOIN_S = 60.0  # a group's ranks open their traces within this of its first

# torchrun's rendezvous of nodes: dynamic (c10d, --standalone) and static (--master-port)
RENDEZVOUS_MODULES = {"torch.distributed.elastic.rendezvous.dynamic_rendezvous":
                      "DynamicRendezvousHandler",
                      "torch.distributed.elastic.rendezvous.static_tcp_rendezvous":
                      "StaticTCPRendezvous"}

_PATCH_AFTER_IMPORT: dict[str, Callable[[Any], None]] = {}
_state: dict[str, Any] = {}  # this process's rank once it is one: tracer, end


def install() -> None:
    """Called by the sitecustomize ``write_hook`` writes, as every Python process of the command
    starts: wrap what matters once its module is imported."""
    if not os.environ.get(HOOK_DIR) or any(isinstance(f, _AfterImport) for f in sys.meta_path):
        return
    _PATCH_AFTER_IMPORT.update({module: _patch_rendezvous for module in RENDEZVOUS_MODULES})
    _PATCH_AFTER_IMPORT.update({"torch.distributed": _patch_init,
                                "torch.multiprocessing.spawn": _patch_spawn_wrap,
                                "multiprocessing.process": _patch_process_run})
    for name, patch in _PATCH_AFTER_IMPORT.items():
        if name in sys.modules:  # imported before us (multiprocessing, by site itself)
            patch(sys.modules[name])
    sys.meta_path.insert(0, _AfterImport())


class _AfterImport(importlib.abc.MetaPathFinder):
    """Patch a module of ``_PATCH_AFTER_IMPORT`` right after it is executed, before anyone
    imports a name from it."""

    def find_spec(self, name, path, target=None):
        if name not in _PATCH_AFTER_IMPORT:
            return None
        for finder in sys.meta_path:
            if finder is self:
                continue
            spec = finder.find_spec(name, path, target) if hasattr(finder, "find_spec") \
                else None
            if spec is not None and spec.loader is not None \
                    and hasattr(spec.loader, "exec_module"):
                spec.loader = _Patching(spec.loader, _PATCH_AFTER_IMPORT[name])
                return spec
            if spec is not None:
                return None
        return None


class _Patching(importlib.abc.Loader):
    def __init__(self, loader, patch: Callable[[Any], None]):
        self.loader = loader
        self.patch = patch

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        self.loader.exec_module(module)
        try:
            self.patch(module)
        # Said on stderr; the user job runs on; the user's job runs whatever happens to the hook.
        except Exception as exc:  # noqa: BLE001
            sys.stderr.write(f"distdoctor: could not hook {module.__name__} ({exc!r})\n")

    def __getattr__(self, name: str) -> Any:  # get_resource_reader, is_package, ...
        return getattr(self.loader, name)


def _patch_init(distributed) -> None:
    """``init_process_group`` makes the process a traced rank of a new group (again after a
    ``destroy_process_group``, which ends the rank's part in the group before)."""
    import inspect  # here: every Python of the command imports this module

    from torch.distributed import distributed_c10d as c10d

    init, destroy = c10d.init_process_group, c10d.destroy_process_group
    if getattr(init, "_distdoctor", False):
        return
    signature = inspect.signature(init)

    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        note = _note_joining(signature, args, kwargs)
        try:
            result = init(*args, **kwargs)
        except BaseException as exc:
            if note is not None:
                _note_raised_joining(note, exc)
            raise
        if note is not None:
            note.unlink(missing_ok=True)
        try:
            _open_group(_rendezvous(args, kwargs), _init_line())
        except Exception as exc:  # noqa: BLE001 (said on stderr; the user job runs on)
            sys.stderr.write(f"distdoctor: this rank is not traced ({exc!r})\n")
        return result

    def destroy_process_group(group: Any = None) -> Any:
        result = destroy(group)
        if (group is None or group is c10d.GroupMember.WORLD) and "tracer" in _state:
            _say_end(0)  # the rank's part in this group is over
            _state["watch"].set()
        return result

    for ours, theirs in ((init_process_group, init), (destroy_process_group, destroy)):
        ours._distdoctor = True  # type: ignore[attr-defined]
        ours.__wrapped__ = theirs  # type: ignore[attr-defined]
        ours.__doc__ = theirs.__doc__
        # torch.distributed's own modules that took the name while the package was being
        # imported (device_mesh: init_device_mesh calls it) get ours too
        for module in [m for name, m in list(sys.modules.items())
                       if name.startswith("torch.distributed") and m is not None]:
            if getattr(module, theirs.__name__, None) is theirs:
                setattr(module, theirs.__name__, ours)


_SPAWN_WRAP: list[Callable] = []  # torch.multiprocessing.spawn's own _wrap


def _patch_spawn_wrap(spawn) -> None:
    """``mp.spawn``'s child wrapper catches the rank's exception and exits 1: note it on
    its way out. The replacement is pickled by name into each spawned child."""
    if spawn._wrap is not spawn_wrap:
        _SPAWN_WRAP[:] = [spawn._wrap]
        spawn._wrap = spawn_wrap


def spawn_wrap(fn, i, args, *rest):
    if not _SPAWN_WRAP:  # unpickled in a child before torch.multiprocessing was imported
        import torch.multiprocessing.spawn  # noqa: F401 (patches, filling _SPAWN_WRAP)
    return _SPAWN_WRAP[0](_noting(fn), i, args, *rest)


def _patch_process_run(process) -> None:
    """``multiprocessing.Process`` prints a target's traceback and exits 1: note it first."""
    original = process.BaseProcess.run
    if getattr(original, "_distdoctor", False):
        return

    def run(self) -> None:
        return _noting(lambda: original(self))()

    run._distdoctor = True  # type: ignore[attr-defined]
    process.BaseProcess.run = run


def _noting(fn: Callable) -> Callable:
    def noted(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:
            _note_raised(exc)
            raise

    return noted


def _rendezvous(args: tuple, kwargs: dict) -> str:
    """What every rank of one process group shares: its rendezvous."""
    init_method = kwargs.get("init_method", args[1] if len(args) > 1 else None)
    store = kwargs.get("store", args[5] if len(args) > 5 else None)
    if init_method:
        return str(init_method)
    if store is not None:
        where = [str(getattr(store, name)) for name in ("host", "port", "path")
                 if hasattr(store, name)]
        return f"{type(store).__name__}:{':'.join(where) or id(store)}"
    return "env://" + ":".join(os.environ.get(k, "?") for k in ("MASTER_ADDR", "MASTER_PORT",
                                                               "TORCHELASTIC_RUN_ID"))


def _patch_rendezvous(module) -> None:
    """torchrun's agent: its rendezvous of nodes noted while it waits (rendezvous_note.py);
    the handler gets torch's own result and exceptions, untouched."""
    handler = getattr(module, RENDEZVOUS_MODULES[module.__name__])
    original = handler.next_rendezvous
    if getattr(original, "_distdoctor", False):
        return

    def next_rendezvous(self: Any) -> Any:
        from distdoctor.userjob.inrank.rendezvous_note import RendezvousNote
        from distdoctor.userjob.watching.rendezvous import RENDEZVOUS

        try:
            note: RendezvousNote | None = RendezvousNote(Path(os.environ[HOOK_DIR]) /
                                                         RENDEZVOUS, self)
        except Exception as exc:  # noqa: BLE001 (said on stderr; the launcher goes on)
            sys.stderr.write(f"distdoctor: this node's rendezvous is not recorded ({exc!r})\n")
            note = None
        try:
            result = original(self)
        except BaseException as exc:
            if note is not None:
                note.end(exc)
            raise
        if note is not None:
            note.end(None)
        return result

    next_rendezvous._distdoctor = True  # type: ignore[attr-defined]
    next_rendezvous.__doc__ = original.__doc__
    handler.next_rendezvous = next_rendezvous


def _note_joining(signature: Any, args: tuple, kwargs: dict) -> Path | None:
    """Write what this process gives init_process_group where ``distdoctor run --`` reads
    it while the call waits (a group that can never form never returns to be traced):
    the file, or None if it could not be written (said once; the job goes on)."""
    import json
    import socket

    from distdoctor.trace.startup import init_event
    from distdoctor.userjob.watching.joining import JOINING

    try:
        folder = Path(os.environ[HOOK_DIR]) / JOINING
        folder.mkdir(exist_ok=True)
        event = init_event(signature, args, kwargs, _init_line())
        event.update(pid=os.getpid(), host=socket.gethostname())
        note = folder / f"{socket.gethostname()}-{os.getpid()}.json"
        written = note.with_suffix(".part")
        written.write_text(json.dumps(event))
        os.replace(written, note)  # read whole or not at all
        return note
    except Exception as exc:  # noqa: BLE001 (said on stderr; the user job runs on)
        sys.stderr.write(f"distdoctor: this rank's start-up is not recorded ({exc!r})\n")
        return None


def _note_raised_joining(note: Path, exc: BaseException) -> None:
    """The call raised (a backend this rank cannot make, a store that refused it): its
    note stays, with the error, so the watcher reads the rank's start-up with the others'
    even once the process is gone (the ranks left waiting may be why it failed)."""
    import json
    import traceback

    try:
        event = json.loads(note.read_text())
        event["raised"] = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        written = note.with_suffix(".part")
        written.write_text(json.dumps(event))
        os.replace(written, note)
    except Exception as failed:  # noqa: BLE001 (said on stderr; the user's error goes on)
        sys.stderr.write(f"distdoctor: this rank's failed start-up is not recorded "
                         f"({failed!r})\n")


def _init_line() -> str:
    from distdoctor.trace.tracer import user_line

    return user_line(skip=(__file__,))


def _group_directory(root: Path, rendezvous: str, rank: int, world: int) -> tuple[Path, int]:
    """The directory this rank's trace goes to, and the trace's descriptor (created here,
    so two ranks never take one name): the first of its rendezvous that lacks this rank,
    is not full and was opened within JOIN_S (the ranks of one group leave
    ``init_process_group`` together), else a new one."""
    tag = hashlib.sha1(f"{rendezvous} {world}".encode()).hexdigest()[:8]
    number = 1
    while True:
        directory = root / f"pg-{tag}-{number}"
        directory.mkdir(parents=True, exist_ok=True)
        try:
            opened = (directory / OPENED).stat().st_mtime
        except FileNotFoundError:
            (directory / OPENED).touch()
            opened = time.time()
        if time.time() - opened < JOIN_S and \
                len(list(directory.glob("rank-*.jsonl"))) < world:
            try:
                fd = os.open(directory / f"rank-{rank}.jsonl",
                             os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                return directory, fd
            except FileExistsError:
                pass
        number += 1


def _open_group(rendezvous: str, init_line: str) -> None:
    """From now on this process is rank ``get_rank()`` of a new group: its trace, stacks
    file, stall watch and start line (the tracer itself is installed once per process and
    moves to the new trace)."""
    import faulthandler
    import signal
    import socket

    import torch.distributed as dist

    from distdoctor.launch import procs
    from distdoctor.models.events import Ev
    from distdoctor.userjob.inrank import bootstrap

    rank, world = dist.get_rank(), dist.get_world_size()
    if "tracer" in _state and not _state.get("ended"):
        _say_end(0)  # a second init without a destroy: the first group's part is over
        _state["watch"].set()
    directory, fd = _group_directory(Path(os.environ[HOOK_DIR]), rendezvous, rank, world)
    stack_file = open(directory / f"rank-{rank}.stacks", "w")
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    faulthandler.enable(stack_file, all_threads=True)  # a fatal signal's stacks
    tracer = _state.get("tracer")
    if tracer is None:
        # (its init_process_group has returned: the hook itself wraps the next one)
        tracer = bootstrap.install(fd, os.environ.get(HOOK_LIGHT) == "1", rank, startup=False)
        bootstrap.patch_os_exit(_say_end)
        atexit.register(_at_exit)
        _wrap_exit_and_excepthook()
    else:
        tracer.reset()
        tracer.fd, tracer.rank = fd, rank
    _state.update(tracer=tracer, directory=directory, pid=os.getpid(), ended=False,
                  stack_file=stack_file)
    deadline = float(os.environ.get(HOOK_DEADLINE, "") or deadlines.IN_RANK_S)
    _state["watch"] = bootstrap.watch_for_stalls(tracer, deadline, stack_file, False,
                                                 str(directory), directory.name, rank, world,
                                                 watched=True)
    tracer.write(ev=Ev.START, t=procs.now(), run=directory.name, rank=rank, pid=os.getpid(),
                 host=socket.gethostname(), world=world, threads=bootstrap.thread_names(),
                 rendezvous=rendezvous, init=init_line)


def _say_end(code: int, error: str | None = None) -> None:
    """The rank's end in its trace, once (the first way out to say it wins)."""
    if _state.get("ended", True) or _state.get("pid") != os.getpid():
        return
    _state["ended"] = True
    from distdoctor.userjob.inrank import bootstrap

    bootstrap.say_exit(_state["tracer"], code, error)


def _note_raised(exc: BaseException) -> None:
    if "tracer" not in _state:
        return
    import traceback

    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    _say_end(1, "".join(traceback.format_exception(type(exc), exc, tb)))


def _wrap_exit_and_excepthook() -> None:
    """A main-thread exception (torchrun's workers, plain scripts) and ``sys.exit(code)``'s
    code reach the trace too."""
    hook = sys.excepthook

    def excepthook(kind, value, tb) -> None:
        if not issubclass(kind, KeyboardInterrupt):
            _note_raised(value)
        hook(kind, value, tb)

    sys.excepthook = excepthook
    original_exit = sys.exit

    def exit(code: Any = None) -> None:
        _state["code"] = code
        original_exit(code)

    sys.exit = exit  # type: ignore[assignment]


def _at_exit() -> None:
    code = _state.get("code")
    if code is None:
        _say_end(0)
    elif isinstance(code, int):
        _say_end(code)
    else:
        _say_end(1)  # sys.exit("message")



SITECUSTOMIZE = '''"""Written by distdoctor run -- COMMAND: trace the processes of COMMAND
that become ranks (distdoctor.userjob.inrank.autohook), then run the sitecustomize this one
shadows, if any."""
import sys

try:
    from distdoctor.userjob.inrank.autohook import install
except ImportError:  # a Python without distdoctor installed: its processes run untraced
    pass
else:
    install()
_here = __file__.rsplit("/", 1)[0]
_path = sys.path[:]
sys.path[:] = [p for p in sys.path if p != _here]
_ours = sys.modules.pop("sitecustomize")
try:
    import sitecustomize  # noqa: F401 (the user's own, found further along the path)
except ModuleNotFoundError as _missing:
    if _missing.name != "sitecustomize":
        raise
finally:
    sys.modules["sitecustomize"] = _ours  # what the import system expects to find
'''


def write_hook(directory: Path) -> Path:
    """The folder to put first on PYTHONPATH: it holds our sitecustomize alone."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "sitecustomize.py").write_text(SITECUSTOMIZE)
    return directory


__all__ = ["install", "write_hook", "HOOK_DIR", "HOOK_DEADLINE", "HOOK_LIGHT"]
