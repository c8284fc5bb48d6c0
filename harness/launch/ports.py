"""A loopback port free now: for a rendezvous that launchers started apart must share
(torchrun's nodes under a grader, tests' launchers), chosen so runs side by side never
meet at one address."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port on 127.0.0.1 nothing listens on now (the kernel's choice of an ephemeral
    one; free until someone else takes it, which the ranks' own bind then says)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
