"""torchrun's agents that ``attach`` finds waiting in their rendezvous of nodes.

A job whose nodes can never meet (another ``--rdzv-id`` or ``--nnodes`` on one node) has
no rank to attach to: only its agents, each inside ``next_rendezvous``. What each one
waits for is on its own command line, read from /proc and parsed by torchrun's own
argument parser (nothing is run, and the store is never touched); its stack, read by
py-spy, shows it is still in the rendezvous. The same judgement as under ``run --``
(analysis/rendezvous.py) names the cause.
"""

from __future__ import annotations

import os
from pathlib import Path

from distdoctor.analysis.rendezvous import AgentNote
from distdoctor.launch import tree
from distdoctor.userjob.attaching import pyspy

RUN_MODULE = "torch.distributed.run"


def waiting_agents(root: int) -> list[AgentNote]:
    """The torchrun agents at or under ``root`` whose main thread is in next_rendezvous."""
    links = tree.parents()
    found = []
    for pid in [root] + tree.descendants(root, links):
        args = torchrun_arguments(_command_line(pid))
        if args is None:
            continue
        try:
            snapshot = pyspy.dump(pid, with_locals=False)
        except pyspy.StackReadError:
            continue  # gone, or not readable: not judged
        if not any(f.function == "next_rendezvous" for t in snapshot.threads
                   for f in t.frames):
            continue
        note = agent_note(pid, args, _started(pid))
        if note is not None:
            found.append(note)
    return found


def torchrun_arguments(argv: list[str]) -> list[str] | None:
    """torchrun's own arguments in a command line (``torchrun ...``, ``python -m
    torch.distributed.run ...``, ``python .../torch/distributed/run.py ...``), else None."""
    index = 1
    while index < len(argv) and argv[index].startswith("-") and argv[index] != "-m":
        index += 2 if argv[index] in ("-X", "-W") else 1  # the interpreter's own options
    if index + 1 < len(argv) and argv[index] == "-m":
        return argv[index + 2:] if argv[index + 1] == RUN_MODULE else None
    script = argv[index] if index < len(argv) else ""
    if os.path.basename(script) == "torchrun" or \
            script.endswith(os.path.join("torch", "distributed", "run.py")):
        return argv[index + 1:]
    return None


def agent_note(pid: int, args: list[str], since: float) -> AgentNote | None:
    """What an agent with these arguments waits for, by torchrun's own parser; None if
    they do not parse (then torchrun would not have started either)."""
    from torch.distributed.run import get_args_parser, parse_min_max_nnodes

    try:
        parsed, _ = get_args_parser().parse_known_args(args)
        low, high = parse_min_max_nnodes(parsed.nnodes)
    except (SystemExit, ValueError, RuntimeError):
        return None
    static = not parsed.standalone and parsed.rdzv_backend == "static"
    endpoint = f"{parsed.master_addr}:{parsed.master_port}" if static else \
        parsed.rdzv_endpoint or None
    return AgentNote(pid, os.uname().nodename, since, parsed.rdzv_id, low, high, endpoint,
                     None, None)


def _command_line(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def _started(pid: int) -> float:
    """When the process started, on this machine's monotonic clock (seconds since boot)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    ticks = int(stat[stat.rfind(")") + 2:].split()[19])
    return ticks / os.sysconf("SC_CLK_TCK")
