"""Listening TCP sockets and the processes that hold them, read from the live socket table.

``/proc/net/tcp`` and ``/proc/net/tcp6`` list every socket with its local address, state
and inode; ``/proc/PID/fd`` links name the socket inodes a process holds. Together they
say which of a set of processes listen where, with nothing but the kernel's word for it.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from dataclasses import dataclass
from pathlib import Path

LISTEN = "0A"


@dataclass(frozen=True, order=True)
class Listener:
    pid: int
    address: str
    port: int

    @property
    def loopback(self) -> bool:
        return ipaddress.ip_address(self.address).is_loopback


def _address(hex_address: str) -> tuple[str, int]:
    """``0100007F:8B25`` -> ("127.0.0.1", 35621); IPv6 as four little-endian words."""
    host, port = hex_address.split(":")
    raw = bytes.fromhex(host)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    family = socket.AF_INET if len(words) == 4 else socket.AF_INET6
    return socket.inet_ntop(family, words), int(port, 16)


def listening_inodes() -> dict[int, tuple[str, int]]:
    """Inode -> (address, port) of every TCP socket in the LISTEN state."""
    found = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not os.path.exists(table):
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == LISTEN:
                found[int(fields[9])] = _address(fields[1])
    return found


def socket_inodes(pid: int) -> set[int]:
    inodes = set()
    try:
        entries = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return inodes  # exited meanwhile
    for entry in entries:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{entry}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[len("socket:["):-1]))
    return inodes


def listeners(pids) -> list[Listener]:
    """Every listening TCP socket held by one of ``pids``."""
    table = listening_inodes()
    return sorted(Listener(pid, *table[inode]) for pid in set(pids)
                  for inode in socket_inodes(pid) if inode in table)
