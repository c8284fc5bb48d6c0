"""A group that can never form, judged from what each rank gave init_process_group: the
causes it proves, the healthy start-ups it leaves alone, and the live proof's timing
(only once every rank of the job waits in it)."""

from __future__ import annotations

import json

import pytest

from distdoctor.analysis.startup import backends, backends_differ, never_forms, startup_of
from distdoctor.analysis.waitfor import WaitFor
from distdoctor.models import Startup
from distdoctor.userjob.watching.joining import JOINING, Waiting, judge, waiting

pytestmark = pytest.mark.tier("unit")


def joining(rank: int, world: int = 2, port: str = "29500", host: str = "127.0.0.1",
            passed_rank: int | None = None, passed_world: int | None = None,
            init_method: str | None = None, store: bool = False,
            backend: str | None = "gloo") -> Startup:
    """A rank inside init_process_group, as a launcher of ``world`` ranks started it."""
    env = {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
           "MASTER_ADDR": host, "MASTER_PORT": port}
    return startup_of({"ev": "init", "t": 1.0, "where": "/job/train.py:7", "backend": backend,
                       "init_method": init_method, "rank": passed_rank,
                       "world_size": passed_world, "store": store, "env": env})


def test_healthy_start_ups_prove_nothing():
    cases = [
        {0: joining(0), 1: joining(1)},  # env:// from the launcher
        {0: joining(0, passed_rank=0, passed_world=2), 1: joining(1, passed_rank=1,
                                                                  passed_world=2)},
        # one store, spelt two ways
        {0: joining(0, host="localhost"), 1: joining(1, host="127.0.0.1")},
        {0: joining(0, init_method="tcp://localhost:23456"),
         1: joining(1, init_method="tcp://127.0.0.1:23456")},
        {0: joining(0, init_method="file:///tmp/rdzv"),
         1: joining(1, init_method="file:///tmp/rdzv")},
        # a store object passed in: its address is not ours to compare
        {0: joining(0, port="1", store=True), 1: joining(1, port="2", store=True)},
        {0: joining(0)},  # rank 1 not in it yet: it may still come
    ]
    for inside in cases:
        assert never_forms(inside, 2) is None, inside


def test_backends_are_compared_by_the_names_each_rank_asked_for():
    assert backends(joining(0, backend=None)) is None  # torch's default, alike everywhere
    assert backends(joining(0, backend="GLOO")) == backends(joining(0, backend="cpu:gloo"))
    assert backends(joining(0, backend="cpu:gloo,cuda:nccl")) == {"gloo", "nccl"}
    alike = [{0: joining(0, backend="gloo"), 1: joining(1, backend="cpu:gloo")},
             {0: joining(0, backend=None), 1: joining(1, backend="nccl")},  # not judged
             {0: joining(0, backend="gloo")}]
    for entered in alike:
        assert backends_differ(entered) is None, entered


def test_ranks_asking_for_different_backends_blame_the_fewer_or_every_rank():
    """Each rank picks its own (nccl where it sees a GPU): the odd ones out are named."""
    four = {r: joining(r, world=4, backend="gloo" if r == 3 else "nccl") for r in range(4)}
    found = backends_differ(four)
    assert found is not None and (found.kind, found.ranks) == ("backend-mismatch", (3,))
    assert found.symptom.endswith(": ranks 0-2: nccl; rank 3: gloo"), found.symptom
    two = {0: joining(0, backend="gloo"), 1: joining(1, backend="cpu:gloo,cuda:nccl")}
    found = backends_differ(two)
    assert found is not None and found.ranks == (0, 1)
    assert never_forms(two, 2) is not None  # the live proof too, once every rank waits


def test_a_world_size_beyond_the_ranks_started_names_the_ranks_that_never_come():
    found = never_forms({r: joining(r, passed_world=4) for r in (0, 1)}, 2)
    assert found is not None and (found.kind, found.ranks) == ("world-size-mismatch", (0, 1))
    assert found.headline == "a group of 4, 2 ranks started"  # (it was cut at a file:line)
    assert "for a group of 4 (world_size=4 at" in found.symptom
    assert "but 2 ranks were started (WORLD_SIZE=2 as the launcher set it): ranks 2, 3 " \
           "never come" in found.symptom
    assert 'world_size=int(os.environ["WORLD_SIZE"])' in found.fix
    # the launcher's own WORLD_SIZE, larger than the ranks it started (another node missing)
    found = never_forms({r: joining(r, world=3) for r in (0, 1)}, 2)
    assert found is not None and "WORLD_SIZE=3 in its environment" in found.symptom
    assert "rank 2 never comes" in found.symptom


def test_one_rank_asked_for_twice_is_named_with_what_the_launcher_set():
    found = never_forms({r: joining(r, passed_rank=0) for r in (0, 1)}, 2)
    assert found is not None and (found.kind, found.ranks) == ("duplicate-rank", (0, 1))
    assert "ranks 0, 1 both ask for rank 0 (rank=0 at" in found.symptom
    assert "while the launchers set RANK=0, 1" in found.symptom
    assert 'rank=int(os.environ["RANK"])' in found.fix


def test_local_rank_passed_on_two_nodes_is_said_to_be_the_rank_within_each_node():
    """Two nodes of two: global ranks 0-3, each node's LOCAL_RANK 0 and 1, passed as rank."""
    waiting = {}
    for rank in range(4):
        local = rank % 2
        startup = joining(local, world=4, passed_rank=local)
        env = dict(startup.env, RANK=str(rank), LOCAL_RANK=str(local))
        waiting[rank] = Startup(**{**startup.__dict__, "env": tuple(sorted(env.items()))})
    found = never_forms(waiting, 4)
    assert found is not None and found.kind == "duplicate-rank" and found.ranks == (0, 1, 2, 3)
    assert "ranks 0, 2 both ask for rank 0; ranks 1, 3 both ask for rank 1" in found.symptom
    assert "passed LOCAL_RANK, the rank within each node" in found.symptom


def test_ranks_at_two_ports_wait_at_two_rendezvous():
    found = never_forms({0: joining(0, port="29500"), 1: joining(1, port="29501")}, 2)
    assert found is not None and (found.kind, found.ranks) == ("split-rendezvous", (0, 1))
    assert "rank 0 at 127.0.0.1:29500; rank 1 at 127.0.0.1:29501" in found.symptom


def line(event: dict) -> bytes:
    return json.dumps(event, separators=(",", ":")).encode() + b"\n"


def init_line(rank: int, world: int) -> bytes:
    return line({"ev": "init", "t": 1.0, "where": "t.py:3", "backend": "gloo", "rank": rank,
                 "world_size": world, "env": {"RANK": str(rank), "WORLD_SIZE": "2"}})


def test_the_live_graph_proves_it_once_every_rank_waits_and_forgets_it_once_they_join():
    graph = WaitFor([0, 1])
    graph.feed(0, init_line(0, 4))
    assert graph.proof() is None  # rank 1 may still come with its own start-up
    graph.feed(1, init_line(1, 4))
    proof = graph.proof()
    assert proof is not None and (proof.kind, proof.ranks) == ("startup", (0, 1))
    assert "ranks 2, 3 never come" in proof.text
    healthy = WaitFor([0, 1])
    for rank in (0, 1):
        healthy.feed(rank, init_line(rank, 2))
    assert healthy.proof() is None
    joined = WaitFor([0, 1])
    for rank in (0, 1):
        joined.feed(rank, init_line(rank, 4) + line({"ev": "joined", "t": 2.0}))
    assert joined.proof() is None  # (torch would not let it: the trace says they left it)


def note(pid: int, rank: str | None, world: str | None, passed_world: int | None = None,
         since: float = 10.0) -> Waiting:
    env = {k: v for k, v in (("RANK", rank), ("WORLD_SIZE", world), ("MASTER_ADDR", "h"),
                             ("MASTER_PORT", "1")) if v is not None}
    return Waiting(pid, {"ev": "init", "t": since, "where": "t.py:3", "rank": None,
                         "world_size": passed_world, "env": env, "pid": pid}, since)


def test_notes_of_a_group_that_never_forms_stop_the_command_at_once():
    found = [note(11, "0", "2", passed_world=4), note(12, "1", "2", passed_world=4)]
    hung = judge(found, now=10.5, limit=120)
    assert hung is not None and hung.world == 2 and sorted(hung.ranks) == [0, 1]
    assert hung.proof is not None and "ranks 2, 3 never come" in hung.proof


def test_notes_of_a_healthy_start_up_wait_for_the_start_up_deadline():
    healthy = [note(11, "0", "2"), note(12, "1", "2")]
    assert judge(healthy, now=10.5, limit=120) is None
    assert judge(healthy[:1], now=10.5, limit=120) is None  # rank 1 may still come
    late = judge(healthy[:1], now=131.0, limit=120)  # past it: judged, nothing proven
    assert late is not None and late.proof is None and late.world == 2
    assert list(late.ranks) == [0]


def test_notes_without_the_launchers_numbering_are_numbered_by_pid_and_prove_nothing():
    """mp.spawn's children (no RANK in their environment): their count is not known."""
    spawned = [note(22, None, None, passed_world=4), note(21, None, None, passed_world=4)]
    assert judge(spawned, now=10.5, limit=120) is None
    late = judge(spawned, now=200.0, limit=120)
    assert late is not None and [w.pid for w in late.ranks.values()] == [21, 22]


def test_a_note_of_a_process_gone_is_stale(tmp_path):
    folder = tmp_path / JOINING
    folder.mkdir()
    for pid in (11, 12):
        (folder / f"h-{pid}.json").write_text(json.dumps(note(pid, str(pid - 11), "2").event))
    (folder / "h-13.json").write_text("{not json")
    assert [w.pid for w in waiting(tmp_path, lambda: [11, 99])] == [11]
    assert waiting(tmp_path / "none", lambda: []) == []


def test_a_rank_whose_call_raised_is_read_with_those_still_inside(tmp_path):
    """Rank 1 could not make its backend and raised (its process may be gone); rank 0
    waits: together they prove it. Once the command has ended, every note left is read
    (its launcher stopped rank 0 inside the call)."""
    folder = tmp_path / JOINING
    folder.mkdir()
    for pid, rank, backend in ((11, "0", "gloo"), (12, "1", "nccl")):
        event = dict(note(pid, rank, "2").event, backend=backend)
        if rank == "1":
            event["raised"] = "RuntimeError: Distributed package doesn't have NCCL built in"
        (folder / f"h-{pid}.json").write_text(json.dumps(event))
    found = waiting(tmp_path, lambda: [11])
    assert [(w.pid, w.raised is not None) for w in found] == [(11, False), (12, True)]
    hung = judge(found, now=10.5, limit=120)
    assert hung is not None and hung.proof is not None and "rank 1: nccl" in hung.proof
    assert judge([w for w in found if w.raised], now=500.0, limit=120) is None  # none waits
    assert waiting(tmp_path, lambda: []) == [found[1]]  # rank 0 gone, not raised: stale
    assert [w.pid for w in waiting(tmp_path, lambda: [], ended=True)] == [11, 12]


def test_a_count_without_the_launchers_world_size_says_what_was_counted():
    """mp.spawn's children judged at the start-up deadline: no WORLD_SIZE to quote."""
    bare = {r: startup_of({"ev": "init", "t": 1.0, "where": "t.py:3", "world_size": 4,
                           "rank": r, "env": {}}) for r in (0, 1)}
    found = never_forms(bare, 2)
    assert found is not None and "2 ranks were started (no launcher's WORLD_SIZE: the " \
        "processes that entered the call): ranks 2, 3 never come" in found.symptom


def test_a_rank_whose_store_went_away_while_it_joined_waited_like_the_others(tmp_path,
                                                                            capsys):
    """Seen on two nodes with --exit-on-hang: node 0's ranks saw the proof and left, its
    agent (hosting the store) stopped, and node 1's rank 2, still inside the call, raised
    the store client's error. It waited like the rest: the cause covers all four."""
    from distdoctor.cli.main import main

    lost = ("Traceback (most recent call last):\ntorch.distributed.DistNetworkError: Failed "
            "to recv, got 0 bytes. Connection was likely closed. Did the remote server "
            "shutdown or crash?")
    for rank in range(4):
        local = rank % 2
        events = [{"ev": "start", "t": 0.0, "run": "r", "rank": rank, "world": 4},
                  {"ev": "init", "t": 1.0, "where": "train.py:9", "rank": local,
                   "world_size": 4, "env": {"RANK": str(rank), "LOCAL_RANK": str(local),
                                            "WORLD_SIZE": "4"}},
                  {"ev": "exit", "t": 2.0, "status": "raised", "error": lost, "code": 1}
                  if rank == 2 else {"ev": "stalled", "t": 2.0, "proof": "ranks ..."}]
        (tmp_path / f"rank-{rank}.jsonl").write_text("".join(json.dumps(e) + "\n"
                                                             for e in events))
    report = tmp_path / "r.json"
    assert main(["analyze", str(tmp_path), "--report", str(report)]) == 1
    cause = json.loads(report.read_text())["cause"]
    assert (cause["kind"], cause["ranks"]) == ("duplicate-rank", [0, 1, 2, 3]), \
        capsys.readouterr().out


def agent(pid: int, run_id: str = "job", nodes: tuple[int, int] = (2, 2),
          endpoint: str = "127.0.0.1:29400", since: float = 1.0, returned: bool = False,
          raised: str | None = None, joined: tuple[str, ...] | None = ("h0",)):
    from distdoctor.analysis.rendezvous import AgentNote

    return AgentNote(pid, "h0", since, run_id, nodes[0], nodes[1], endpoint, joined, raised,
                     returned)


def test_agents_at_one_endpoint_that_disagree_are_proven_never_to_meet():
    from distdoctor.analysis.rendezvous import judge

    ids = judge([agent(1, "job-a"), agent(2, "job-b")], now=2.0, limit=120)
    assert ids is not None and ids.proven and ids.kind == "rendezvous-mismatch"
    assert "agent pid 1): --rdzv-id job-a; " in ids.summary and "--rdzv-id job-b" in ids.summary
    # a static rendezvous: node 1 went on with --nnodes 2, node 0 waits for 3
    nodes = judge([agent(1, "none", (3, 3), joined=None), agent(2, "none", returned=True,
                                                                 joined=None)], 2.0, 120)
    assert nodes is not None and nodes.kind == "rendezvous-mismatch"
    assert "torchrun's agents at 127.0.0.1:29400 wait for different numbers of nodes" in \
        nodes.summary and "--nnodes 3; " in nodes.summary


def test_agents_that_agree_or_meet_elsewhere_prove_nothing():
    from distdoctor.analysis.rendezvous import judge

    alike = [[agent(1), agent(2, endpoint="localhost:29400")],  # one store, spelt two ways
             [agent(1, nodes=(1, 2)), agent(2, nodes=(1, 2), returned=True)],
             [agent(1, "job-a"), agent(2, "job-b", endpoint="127.0.0.1:29401")],
             [agent(1, "job-a", endpoint=None), agent(2, "job-b", endpoint=None)],
             # two one-node jobs sharing an endpoint: each rendezvous holds what it asks for
             [agent(1, "job-a", (1, 1)), agent(2, "job-b", (1, 1))],
             [agent(1)]]
    for notes in alike:
        assert judge(notes, now=10.0, limit=120) is None, notes


def test_a_node_alone_is_judged_at_the_deadline_or_when_its_agent_gives_up():
    from distdoctor.analysis.rendezvous import judge

    late = judge([agent(1, joined=("h0",))], now=200.0, limit=120)
    assert late is not None and not late.proven and late.kind == "rendezvous-incomplete"
    assert "waits for 2 nodes (--nnodes 2) and has waited 199 s; nodes joined: h0" in \
        late.summary
    gone = [agent(1, raised="RendezvousTimeoutError", joined=None)]
    assert judge(gone, now=5.0, limit=120) is None  # its launcher ends by itself
    ended = judge(gone, now=5.0, limit=float("inf"), ended=True)
    assert ended is not None and "gave up (RendezvousTimeoutError); nodes joined: not " \
        "known (a static rendezvous)" in ended.summary


def test_agent_notes_are_read_as_untrusted_files(tmp_path):
    from distdoctor.userjob.watching.rendezvous import RENDEZVOUS, agents

    folder = tmp_path / RENDEZVOUS
    folder.mkdir()
    good = {"pid": 11, "host": "h", "t": 1.0, "run_id": "j", "min_nodes": 2,
            "max_nodes": 2, "endpoint": "127.0.0.1:1", "joined": ["h", 3]}
    (folder / "h-11.json").write_text(json.dumps(good))
    (folder / "h-12.json").write_text(json.dumps({**good, "pid": 12, "min_nodes": "2",
                                                  "returned": "yes"}))
    (folder / "h-13.json").write_text("[1, 2")
    (folder / "h-14.json").write_text(json.dumps({**good, "pid": "14"}))
    found = agents(tmp_path, lambda: [11, 12, 14])
    assert [(n.pid, n.min_nodes, n.joined, n.returned) for n in found] == [
        (11, 2, ("h",), False), (12, None, ("h",), False)]
    assert agents(tmp_path, lambda: []) == []  # gone and never raised: stale


def test_an_agents_command_line_says_what_its_rendezvous_waits_for():
    from distdoctor.userjob.attaching.agents import agent_note, torchrun_arguments

    assert torchrun_arguments(["python", "-m", "torch.distributed.run", "--nnodes", "2",
                               "t.py"]) == ["--nnodes", "2", "t.py"]
    assert torchrun_arguments(["/usr/bin/python3", "/venv/bin/torchrun", "t.py"]) == ["t.py"]
    assert torchrun_arguments(["python", "-u", "-X", "dev", "-m", "torch.distributed.run",
                               "t.py"]) == ["t.py"]
    assert torchrun_arguments(["python", "t.py", "torchrun"]) is None
    assert torchrun_arguments(["python", "-m", "pytest", "torchrun"]) is None
    dynamic = agent_note(7, ["--nnodes", "1:3", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                             "h:29400", "--rdzv-id", "j", "t.py"], 1.0)
    assert dynamic is not None and (dynamic.min_nodes, dynamic.max_nodes, dynamic.endpoint,
                                    dynamic.run_id) == (1, 3, "h:29400", "j")
    static = agent_note(8, ["--nnodes", "2", "--node-rank", "1", "--master-addr", "h",
                            "--master-port", "29500", "t.py"], 1.0)
    assert static is not None and (static.nnodes, static.endpoint) == ("2", "h:29500")
    assert agent_note(9, ["--nnodes", "two", "t.py"], 1.0) is None


def _record(ends: list[tuple[str, Startup | None, str]]):
    """A run of ranks, each (status, its start-up, its error)."""
    from distdoctor.models import Evidence, RankEnd, RankRecord, RunRecord, RunSpec

    ranks = tuple(RankRecord(r, RankEnd(r, status, error=error or None),
                             Evidence(r, startup=startup))
                  for r, (status, startup, error) in enumerate(ends))
    return RunRecord(RunSpec(strategy="user-script", world_size=len(ends)), ranks, 1.0)


def test_a_rank_that_asked_for_a_smaller_group_and_raised_is_a_world_size_mismatch():
    """world_size=2 hard-coded, 3 ranks started: ranks 0 and 1 form a group of 2 and
    finish; rank 2, with no place in it, raises inside init_process_group."""
    import dataclasses

    from distdoctor.checks import startup as check

    def entered(rank: int, joined: bool) -> Startup:
        return dataclasses.replace(joining(rank, world=3, passed_rank=rank, passed_world=2),
                                   joined=joined)

    raised = "Traceback ...\nRuntimeError: [enforce fail at context.cc:23] rank < size. 2 vs 2"
    found = check.check(_record([("finished", entered(0, True), ""),
                                 ("finished", entered(1, True), ""),
                                 ("raised", entered(2, False), raised)]))
    assert [(f.kind, f.ranks) for f in found] == [("world-size-mismatch", (2,))]
    assert found[0].measured == {"asked_for": 2, "ranks_started": 3, "formed": [0, 1]}
    assert "world_size=2 at /job/train.py:7" in found[0].symptom
    assert "rank < size. 2 vs 2" in found[0].symptom
    # look-alikes: every rank asks for the ranks started, or the one that asked for fewer
    # joined and finished, or a rank raised after it joined
    right = [("finished", dataclasses.replace(joining(r, world=3), joined=True), "")
             for r in range(3)]
    assert check.check(_record(right)) == []
    assert check.check(_record(right[:2] + [("raised", dataclasses.replace(
        joining(2, world=3), joined=True), raised)])) == []
    assert check.check(_record([("finished", entered(r, True), "") for r in range(3)])) == []


def test_a_rank_that_left_while_its_peer_still_joined_is_told_torchs_missing_barrier():
    """A script with no collective of its own (resume-check's test, once in a suite run
    under load): rank 0's init_process_group returned, it trained, saved and left; rank 1
    was still connecting, and gloo failed it (connectFullMesh: "Connection closed by
    peer"). Told from the start-up records (rank 0 joined, rank 1 not), with the line."""
    from dataclasses import replace

    from distdoctor import checks
    from distdoctor.models import Evidence, RankEnd, RankRecord, RunRecord, RunSpec
    from distdoctor.userjob.reporting.report import report

    raised = RankEnd(1, "raised", error="RuntimeError: Gloo connectFullMesh failed with "
                     "[pair.cc:553] Connection closed by peer [127.0.0.1]:31872")
    record = RunRecord(RunSpec(world_size=2), (
        RankRecord(0, RankEnd(0, "finished"),
                   Evidence(0, startup=replace(joining(0), joined=True))),
        RankRecord(1, raised, Evidence(1, startup=joining(1)))), 1.0)
    cause = report(record, checks.run_all(record), "train.py").cause
    assert cause is not None and (cause.kind, cause.ranks) == ("rank-exited-early", [0])
    assert cause.where == "/job/train.py:7"
    assert cause.summary.startswith(
        "rank 0 ended after 0 traced calls, while rank 1 was still joining the group "
        "(init_process_group at ")
    assert "TORCH_DIST_INIT_BARRIER=1" in cause.summary and "dist.barrier()" in cause.fix
    # a peer that joined and then waited for the rank that left: the general case
    joined = replace(record, ranks=(record.ranks[0], replace(
        record.ranks[1], evidence=Evidence(1, startup=replace(joining(1), joined=True)))))
    general = report(joined, checks.run_all(joined), "train.py").cause
    assert general is not None and "still joining" not in general.summary
