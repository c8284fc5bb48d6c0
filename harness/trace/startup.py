"""A rank's start-up in its trace: what it gives ``init_process_group`` and whether the
call returns.

The hang newcomers meet first is the one before training: ``init_process_group`` waits
for a group that can never form (a world size hard-coded from another cluster, two
processes claiming one rank, ranks pointed at different stores). Its cause is in the
arguments and in what the launcher set, so the rank writes them down as it enters the
call (values only, never its whole environment) and notes the return. torch is given
the caller's own arguments and its result is passed back untouched.
"""

from __future__ import annotations

import inspect
import os
import sys
import time
from typing import Any, Callable, Mapping
from urllib.parse import urlsplit

from distdoctor.analysis.startup import startup_of
from distdoctor.models import Startup
from distdoctor.models.calls import INIT_GROUP
from distdoctor.models.events import Ev

# what a launcher sets for a rank's start-up (torchrun, mp.spawn's users, SLURM scripts)
LAUNCHER_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                      "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")
_OURS = "_distdoctor_startup"


def record_startup(tracer: Any) -> None:
    """Wrap ``init_process_group`` where scripts reach it (torch.distributed, its
    distributed_c10d module, and the modules that call it: device_mesh) to write Ev.INIT
    as it is entered and Ev.JOINED as it returns. Installed before the script runs; a
    script that imported the function before that keeps torch's own (and goes
    unrecorded, as before)."""
    from torch.distributed import distributed_c10d as c10d

    original = c10d.init_process_group
    if getattr(original, _OURS, False):
        return  # (torch's own is wrapped too, by its loggers: __wrapped__ says nothing)
    wrapped = _wrap(tracer, original)
    # torch.distributed's own modules that took the name while the package was imported
    # (device_mesh: init_device_mesh calls it) get the wrapper too
    for module in [m for name, m in list(sys.modules.items())
                   if name.startswith("torch.distributed") and m is not None]:
        if getattr(module, INIT_GROUP, None) is original:
            setattr(module, INIT_GROUP, wrapped)


def _wrap(tracer: Any, original: Callable) -> Callable:
    signature = inspect.signature(original)

    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        from distdoctor.trace.tracer import incomplete, user_line

        try:
            tracer.write(**init_event(signature, args, kwargs, user_line()))
        # The arguments are torch's to judge: a start-up we cannot read is said, not fatal.
        except Exception as exc:  # noqa: BLE001
            incomplete("the start-up's arguments", exc)
        result = original(*args, **kwargs)
        tracer.write(ev=Ev.JOINED, t=time.monotonic())
        return result

    init_process_group.__wrapped__ = original  # type: ignore[attr-defined]
    setattr(init_process_group, _OURS, True)
    init_process_group.__doc__ = original.__doc__
    return init_process_group


def init_event(signature: inspect.Signature, args: tuple, kwargs: dict, where: str) -> dict:
    """The Ev.INIT event of a call of init_process_group with these arguments, made at
    ``where`` (the user's line), now."""
    bound = signature.bind_partial(*args, **kwargs).arguments
    return {"ev": Ev.INIT, "t": time.monotonic(), "where": where,
            **init_fields(bound, os.environ)}


def init_fields(bound: Mapping[str, Any], env: Mapping[str, str]) -> dict:
    """The arguments that decide which group forms, as plain values, and the launcher's
    variables among ``env`` (the rank's own, or read from /proc by attach)."""
    backend, method = bound.get("backend"), bound.get("init_method")
    rank, world = bound.get("rank"), bound.get("world_size")
    return {"backend": str(backend) if backend is not None else None,
            "init_method": _address(method) if isinstance(method, str) else None,
            "rank": rank if isinstance(rank, int) and rank >= 0 else None,
            "world_size": world if isinstance(world, int) and world > 0 else None,
            "store": bound.get("store") is not None,
            "env": {name: env[name] for name in LAUNCHER_VARIABLES if name in env}}


def _address(method: str) -> str:
    """A rendezvous URL without its query (``tcp://h:p?world_size=2`` keeps ``tcp://h:p``)."""
    parts = urlsplit(method)
    return f"{parts.scheme}://{parts.netloc}{parts.path}" if parts.scheme else method


def fold_startup(trace: tuple) -> Startup | None:
    """The rank's last ``init_process_group``, from its trace events; None if it made none
    (or made it before the tracer was installed)."""
    entered = max((i for i, e in enumerate(trace) if e.get("ev") == Ev.INIT), default=None)
    if entered is None:
        return None
    return startup_of(trace[entered],
                      joined=any(e.get("ev") == Ev.JOINED for e in trace[entered + 1:]))
