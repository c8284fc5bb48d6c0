"""The rendezvous store, listening on the address it is given and on no other.

A ``TCPStore`` has no authentication: whoever can connect can read and write the
rendezvous keys, or join or disrupt the group. Created as ``TCPStore("127.0.0.1", 0, ...,
is_master=True)``, torch's server binds every interface anyway (the host name only tells
clients where to connect), so a pool or a ``distdoctor run`` was open to the network for
as long as it ran. Here the socket is bound and listening before torch sees it, and torch
serves on that descriptor (``master_listen_fd``): loopback unless the caller names another
address, which ``distdoctor run --master-addr`` alone does.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from datetime import timedelta
from typing import MutableMapping

LOOPBACK = "127.0.0.1"


class AddressError(ValueError):
    """The address cannot be listened on here (unknown name, not this machine's, in use)."""


def addresses(host: str) -> set[str]:
    """Every address ``host`` names."""
    try:
        return {str(info[4][0])
                for info in socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)}
    except socket.gaierror as exc:
        raise AddressError(f"cannot resolve address {host!r}: {exc.strerror}") from None


def is_loopback(host: str) -> bool:
    """Whether every address ``host`` names is a loopback address (False if it names none)."""
    try:
        found = addresses(host)
    except AddressError:
        return False
    return all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in found)


def listening_socket(host: str = LOOPBACK, port: int = 0) -> socket.socket:
    """A TCP socket bound to ``host:port`` (port 0: one the OS picks) and listening."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as exc:
        raise AddressError(f"cannot resolve address {host!r}: {exc.strerror}") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(socket.SOMAXCONN)
    except OSError as exc:
        sock.close()
        raise AddressError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    return sock


def master_store(world_size: int, timeout: timedelta, host: str = LOOPBACK, port: int = 0):
    """The hosting side of a ``TCPStore`` for ``world_size`` ranks, listening on
    ``host:port`` only. The store owns the socket from then on and closes it when it is
    deleted (measured on torch 2.13)."""
    import torch.distributed as dist

    sock = listening_socket(host, port)
    try:
        store = dist.TCPStore(host, sock.getsockname()[1], world_size, is_master=True,
                              timeout=timeout, wait_for_workers=False,
                              master_listen_fd=sock.fileno())
    except BaseException:
        sock.close()
        raise
    sock.detach()
    return store


def pin_gloo_to_loopback(env: MutableMapping[str, str] | None = None) -> None:
    """Make gloo (and NCCL's bootstrap) listen on the loopback interface, unless the user
    chose an interface: by default gloo binds the address the host name resolves to,
    which on many machines is the network's."""
    target: MutableMapping[str, str] = os.environ if env is None else env
    if os.path.exists("/sys/class/net/lo"):
        target.setdefault("GLOO_SOCKET_IFNAME", "lo")
        target.setdefault("NCCL_SOCKET_IFNAME", "lo")
