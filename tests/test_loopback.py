"""Nothing distdoctor opens listens beyond loopback, by the live socket table.

The kernel's socket table (``sockettable``) is read while a pool job runs, from inside a
``distdoctor run`` of a real script, and on the pool a ``check-collective`` run used; every
listening socket of those processes must be bound to 127.0.0.1 or ::1. Each check also
requires that it saw the store's listener and the ranks' gloo listeners, so it cannot
pass by seeing nothing.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import jobs
import pytest
import sockettable

from distdoctor.cli.main import main

pytestmark = pytest.mark.tier("warm")

TESTS = Path(__file__).parent


def assert_loopback_only(found: list, holders: set[int]) -> None:
    listeners = [sockettable.Listener(*entry) for entry in found]
    assert {l.pid for l in listeners} >= holders, (listeners, holders)
    exposed = [l for l in listeners if not l.loopback]
    assert not exposed, f"listening beyond loopback: {exposed}"


def listeners_of_pool(pool) -> list:
    """The pool's ranks' listening sockets, each read by the rank itself during a job, and
    this process's own (the pool's parent)."""
    found = [entry for rank in pool.run(jobs.own_listeners, deadline=30).values
             for entry in rank]
    mine = [(l.pid, l.address, l.port) for l in sockettable.listeners([os.getpid()])]
    return found + mine


def test_a_pools_store_and_gloo_listen_on_loopback_only(pools):
    pool = pools(2)
    found = listeners_of_pool(pool)
    assert_loopback_only(found, set(pool.pids))  # rank 0 hosts the store; both run gloo


def test_distdoctor_run_listens_on_loopback_only(tmp_path, capfd):
    out = tmp_path / "listeners.json"
    code = main(["run", "--nproc-per-node", "2", "--deadline", "30",
                 str(TESTS / "show_listeners.py"), str(out)])
    assert code == 0, capfd.readouterr()
    found = json.loads(out.read_text())
    # this process hosts the store, as torchrun's agent does; the two ranks run gloo
    assert_loopback_only(found, {os.getpid()})
    assert len({pid for pid, _, _ in found} - {os.getpid()}) == 2, found


def test_check_collectives_pool_listens_on_loopback_only(capsys):
    from distdoctor.launch.pool import shared_pool

    assert main(["check-collective", "collective_impls:ring_allreduce", "--kind",
                 "allreduce", "--examples", "5", "--world-sizes", "3-3"]) == 0, \
        capsys.readouterr().out
    pool = shared_pool(3, mesh=True)  # the pool the check ran on, still up
    assert_loopback_only(listeners_of_pool(pool), set(pool.pids))


@pytest.mark.parametrize("argv, error", [
    (["--master-addr", "no-such-host.invalid"], "cannot resolve address"),
    (["--master-port", "70000"], "outside 0-65535"),
])
def test_a_bad_master_address_is_one_line_and_exit_code_2(argv, error, capsys):
    try:
        code = main(["run", *argv, str(TESTS / "show_listeners.py"), "x.json"])
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and error in err and len(err.strip().splitlines()) == 1, err


def test_a_named_master_address_is_where_the_store_listens_and_it_says_so(tmp_path, capfd):
    out = tmp_path / "listeners.json"
    code = main(["run", "--nproc-per-node", "2", "--master-addr", "0.0.0.0",
                 str(TESTS / "show_listeners.py"), str(out)])
    printed = capfd.readouterr()
    assert code == 0, printed
    assert "the rendezvous store listens on 0.0.0.0, open to whoever can reach it" in printed.err
    stores = {address for pid, address, _ in json.loads(out.read_text()) if pid == os.getpid()}
    assert stores == {"0.0.0.0"}
