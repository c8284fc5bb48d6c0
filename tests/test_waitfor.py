"""The live wait-for state on hand-written trace lines: what it proves, and what it leaves
to the deadline (a rank that computes, an any-source receive, a call off the main thread)."""

from __future__ import annotations

import json

import pytest

from distdoctor.analysis.waitfor import WaitFor

pytestmark = pytest.mark.tier("unit")

GROUP = [0, 1]


def enter(call_id, op=None, seq=0, peer=None, group=GROUP, async_op=False, **extra):
    return {"ev": "enter", "id": call_id, "t": 0.0, "op": op, "seq": seq, "group": group,
            "peer": peer, "peers": extra.pop("peers", []), "shapes": extra.pop("shapes", [[4]]),
            "dtype": "float32", "reduce_op": extra.pop("reduce_op", None), "where": "s.py:1",
            "async_op": async_op, **extra}


def state(*per_rank, world=2):
    waits = WaitFor(range(world))
    for rank, events in enumerate(per_rank):
        # compact, as the tracer writes; fed in two pieces cut inside a line, as a pipe may
        # deliver them
        data = b"".join(json.dumps(e, separators=(",", ":")).encode() + b"\n" for e in events)
        waits.feed(rank, data[:7])
        waits.feed(rank, data[7:])
    return waits


def test_two_ranks_sending_first_are_a_proven_cycle():
    proof = state([enter(1, "send", 0, peer=1)], [enter(1, "send", 0, peer=0)]).proof()
    assert (proof.kind, proof.ranks, proof.calls) == ("cycle", (0, 1), ((0, 1), (1, 1)))
    assert proof.text.startswith("ranks 0 -> 1 -> 0 each wait for the next")


def test_a_send_whose_receive_is_posted_is_not_stuck():
    assert state([enter(1, "send", 0, peer=1)], [enter(1, "recv", 0, peer=0)]).proof() is None


def test_a_receive_while_the_peer_computes_is_not_stuck():
    assert state([enter(1, "recv", 0, peer=1)], []).proof() is None


def test_a_send_ring_of_four_and_a_receive_ring_of_three():
    sends = [[enter(1, "send", 0, peer=(r + 1) % 4, group=[0, 1, 2, 3])] for r in range(4)]
    assert state(*sends, world=4).proof().ranks == (0, 1, 2, 3)
    recvs = [[enter(1, "recv", 0, peer=(r + 1) % 3, group=[0, 1, 2])] for r in range(3)]
    assert state(*recvs, world=3).proof().kind == "cycle"


def test_different_collectives_at_one_number_are_a_mismatch():
    proof = state([enter(1, "all_reduce", 0, reduce_op="SUM")],
                  [enter(1, "barrier", 0, shapes=[])]).proof()
    assert (proof.kind, proof.ranks) == ("mismatch", (0, 1))
    assert "rank 0 in all_reduce (#0, (4,), float32, SUM) at s.py:1" in proof.text
    assert "rank 1 in barrier (#0, float32) at s.py:1" in proof.text


def test_calls_that_gloo_still_pairs_are_no_mismatch():
    """Measured on gloo: these complete (one side, or both, silently or with a crash), so
    blocking in them together for a while is no proof of a hang."""
    pairs = [(dict(op="all_reduce", reduce_op="SUM"), dict(op="all_reduce", reduce_op="MAX")),
             (dict(op="all_reduce", shapes=[[4]]), dict(op="all_reduce", shapes=[[2, 2]])),
             (dict(op="all_reduce", shapes=[[4]]), dict(op="all_reduce", shapes=[[5]])),
             (dict(op="all_reduce"), dict(op="reduce_scatter_tensor")),
             (dict(op="all_reduce"), dict(op="reduce_scatter")),
             (dict(op="all_gather"), dict(op="all_gather_into_tensor")),
             (dict(op="all_to_all"), dict(op="all_to_all_single"))]
    for first, second in pairs:
        assert state([enter(1, seq=0, **first)], [enter(1, seq=0, **second)]).proof() is None


def test_two_groups_of_the_same_ranks_are_apart():
    """rank 0 all-reduces on a new group of ranks [0, 1], rank 1 on the default group: the
    same ranks, but neither call can pair with the other."""
    proof = state([enter(1, "all_reduce", 0, pg="1")], [enter(1, "all_reduce", 0)]).proof()
    assert proof.kind == "cycle" and proof.ranks == (0, 1)
    assert state([enter(1, "all_reduce", 0, pg="1")],
                 [enter(1, "all_reduce", 0, pg="1")]).proof() is None


def test_rooted_calls_with_different_roots_are_a_mismatch():
    proof = state([enter(1, "broadcast", 0, peer=0)], [enter(1, "broadcast", 0, peer=1)]).proof()
    assert proof.kind == "mismatch" and "rooted at 0" in proof.text and "rooted at 1" in proof.text


def test_gather_shapes_differ_at_the_root_and_that_is_no_mismatch():
    same = dict(peer=0)
    assert state([enter(1, "gather", 0, shapes=[[4], [4], [4]], **same)],
                 [enter(1, "gather", 0, shapes=[[4]], **same)]).proof() is None


def test_a_collective_waiting_for_a_finished_rank():
    waits = state([enter(1, "all_reduce", 0)], [])
    assert waits.proof() is None  # rank 1 may still be computing
    waits.finished(1)
    proof = waits.proof()
    assert (proof.kind, proof.ranks) == ("exited", (0,))
    assert proof.text.startswith("rank 1 finished while rank 0 waits in all_reduce (#0, ")


def test_a_collective_and_a_receive_waiting_on_each_other_are_a_cycle():
    proof = state([enter(1, "all_reduce", 1), ], [enter(1, "all_reduce", 0),
                                                 {"ev": "done", "id": 1, "t": 0.0},
                                                 enter(2, "recv", 0, peer=0)]).proof()
    assert proof.kind == "cycle" and proof.ranks == (0, 1)


def test_an_async_call_blocks_only_once_waited_on():
    isend = enter(1, "isend", 0, peer=1, async_op=True)
    waits = state([isend], [enter(1, "isend", 0, peer=0, async_op=True)])
    assert waits.proof() is None
    for rank in (0, 1):
        waits.feed(rank, b'{"ev":"wait","id":1,"t":0.0,"where":"s.py:2"}\n')
    assert waits.proof().kind == "cycle"
    waits.feed(0, b'{"ev":"done","id":1,"t":0.0}\n')
    assert waits.proof() is None


def test_a_batch_waits_for_its_unmatched_ops_only():
    batch = [enter(1, "batch_isend_irecv", 0, async_op=True,
                   peers=[["send", 1, 0], ["recv", 1, 0]])]
    waits = state(batch, [enter(1, "recv", 0, peer=0)])
    waits.feed(0, b'{"ev":"wait","id":1,"t":0.0}\n')
    # rank 1 receives rank 0's send, and rank 0's receive waits for rank 1, which is
    # inside a call that will complete: nothing is stuck
    assert waits.proof() is None


def test_unknowable_waits_are_left_to_the_deadline():
    any_source = state([enter(1, "recv", 0, peer=None)], [enter(1, "recv", 0, peer=0)])
    assert any_source.proof() is None
    off_main = state([enter(1, "send", 0, peer=1, main=False)], [enter(1, "send", 0, peer=0)])
    assert off_main.proof() is None


def test_a_rank_that_ever_received_from_any_source_proves_nothing():
    """Rank 1's receive from any source took rank 0's send #0, but counts per peer cannot
    know it: rank 0's send #1 would look unmatched while rank 1 was still receiving it."""
    done = {"ev": "done", "id": 1, "t": 0.0}
    any_then_send = state([enter(1, "send", 0, peer=1), done, enter(2, "send", 1, peer=1)],
                          [enter(1, "recv", 0, peer=None), done, enter(2, "send", 0, peer=0)])
    assert any_then_send.proof() is None


def test_a_send_and_a_receive_pair_only_with_the_same_tag():
    """gloo matches by peer and tag: each tag is a channel of its own, numbered apart."""
    send = enter(1, "send", 0, peer=1, tag=7)
    assert state([send], [enter(1, "recv", 0, peer=0, tag=7)]).proof() is None
    crossed = state([send], [enter(1, "recv", 0, peer=0, tag=8)]).proof()
    assert crossed.kind == "cycle" and crossed.ranks == (0, 1)
    assert state([send], [enter(1, "send", 0, peer=0, tag=7)]).proof().kind == "cycle"
    batch = enter(1, "batch_isend_irecv", 0, async_op=True, peers=[["recv", 1, 0, 7]])
    waits = state([batch, {"ev": "wait", "id": 1, "t": 0.0}], [send | {"peer": 0}])
    assert waits.proof() is None  # the batch's receive, tag 7, is rank 1's send's match


def view(enqueued, completed, ops, pg=None):
    """A Flight Recorder view of one group, as flight.in_flight gives it."""
    return {pg: {"enqueued": enqueued, "completed": completed, "ops": ops}}


def test_a_collective_the_tracer_never_saw_proves_a_mismatch():
    """DDP's bucket-rebuild broadcast is made from C++: rank 1 looks to the tracer as if
    it computed, but the Flight Recorder shows a broadcast where rank 0 has its all-reduce."""
    waits = state([enter(1, "all_reduce", 0)], [])
    assert waits.proof() is None and waits.needs_flight()
    waits.flight(0, view(5, 4, {5: "all_reduce"}))
    waits.flight(1, view(5, 4, {5: "broadcast"}))
    assert not waits.needs_flight()
    proof = waits.proof()
    assert (proof.kind, proof.ranks) == ("mismatch", (0,))
    assert "collective #5 of its group" in proof.text and "rank 1 has broadcast" in proof.text


def test_a_member_that_enqueued_the_collective_untraced_is_not_awaited():
    """Traced counts alone see a cycle (rank 1 never entered a traced collective); the
    Flight Recorder shows rank 1 enqueued the matching all-reduce (DDP's, from C++)."""
    calls = ([enter(1, "all_reduce", 0)], [enter(1, "recv", 0, peer=0)])
    assert state(*calls).proof().kind == "cycle"
    waits = state(*calls)
    waits.flight(0, view(3, 2, {3: "all_reduce"}))
    waits.flight(1, view(3, 2, {3: "all_reduce"}))
    assert waits.proof() is None


def test_a_view_taken_before_the_rank_moved_on_is_not_used():
    waits = state([enter(1, "all_reduce", 0)], [])
    waits.flight(0, view(5, 4, {5: "all_reduce"}))
    waits.flight(1, view(5, 4, {5: "broadcast"}))
    waits.feed(0, b'{"ev":"done","id":1,"t":0.0}\n' + json.dumps(
        enter(2, "all_reduce", 1), separators=(",", ":")).encode() + b"\n")
    assert waits.needs_flight() and waits.proof() is None


def test_traced_numbers_that_the_flight_recorder_places_apart_are_no_mismatch():
    """A list reduce_scatter is two of gloo's all-reduces: rank 0, past it, waits in a
    barrier at traced #1 while rank 1 is still in its second all-reduce, traced #1 too."""
    calls = ([enter(1, "barrier", 1)], [enter(1, "all_reduce", 1)])
    assert state(*calls).proof().kind == "mismatch"
    waits = state(*calls)
    waits.flight(0, view(3, 2, {3: "barrier"}))
    waits.flight(1, view(2, 1, {2: "all_reduce"}))
    assert waits.proof() is None


def test_a_call_the_flight_recorder_does_not_hold_falls_back_to_traced_numbers():
    waits = state([enter(1, "monitored_barrier", 0)], [enter(1, "all_reduce", 0)])
    waits.flight(0, view(2, 2, {}))
    waits.flight(1, view(3, 2, {3: "all_reduce"}))
    assert waits.proof().kind == "mismatch"


def test_an_async_collective_waited_on_is_placed_when_its_open_calls_line_up():
    """ZeroRedundancyOptimizer broadcasts every shard asynchronously and waits on each: rank
    1 waits on its first broadcast; rank 0 is inside DDP's all-reduce, which only the Flight
    Recorder sees (its comm hook's future is waited on from C++)."""
    casts = [enter(i + 1, "broadcast", i, peer=0, async_op=True) for i in range(3)]
    waits = state([], casts + [{"ev": "wait", "id": 1, "t": 0.0}])
    waits.flight(0, view(4, 3, {4: "all_reduce"}))
    waits.flight(1, view(6, 3, {4: "broadcast", 5: "broadcast", 6: "broadcast"}))
    proof = waits.proof()
    assert (proof.kind, proof.ranks) == ("mismatch", (1,)) and "rank 0 has all_reduce" in proof.text
    # one op in flight that no open traced call accounts for: no place, and with rank 0's
    # all-reduce at the number where rank 1 has one too, nothing the recorders prove
    waits.flight(0, view(5, 4, {5: "all_reduce"}))
    waits.flight(1, view(7, 3, {4: "broadcast", 5: "all_reduce", 6: "broadcast",
                                7: "broadcast"}))
    assert waits.proof() is None


def test_collectives_in_flight_at_one_number_of_different_kinds_are_proven_without_the_trace():
    """ZeroRedundancyOptimizer with a skipped head, as seen under load: rank 0's all-reduce
    is waited on from C++ (DDP), so the tracer sees no wait; rank 1 waits on the first of
    its traced broadcasts, which the recorder's in-flight ones do not line up with (gloo
    let one of a mismatched run's broadcasts through). The recorders alone still show #67
    holding an all-reduce on rank 0 and a broadcast on rank 1: neither can complete."""
    calls = ([enter(1, "all_reduce", 0, async_op=True)],
             [enter(1, "broadcast", 0, peer=0, async_op=True),
              enter(2, "broadcast", 1, peer=1, async_op=True),
              {"ev": "wait", "id": 1, "t": 0.0}])
    waits = state(*calls)
    waits.flight(0, view(67, 66, {67: "all_reduce"}))
    waits.flight(1, view(68, 65, {66: "broadcast", 67: "broadcast", 68: "broadcast"}))
    proof = waits.proof()
    assert (proof.kind, proof.ranks, proof.calls) == ("mismatch", (0, 1), ((1, 1),))
    assert "collective #67 of the default group" in proof.text
    assert "rank 0 has all_reduce; rank 1 has broadcast" in proof.text
    same = state(*calls)  # the same kind at every number in flight: nothing proven
    same.flight(0, view(67, 66, {67: "broadcast"}))
    same.flight(1, view(68, 65, {66: "broadcast", 67: "broadcast", 68: "broadcast"}))
    assert same.proof() is None


DONE = {"ev": "done", "t": 0.0}


def made(seqs_and_sizes, group=GROUP, line=1):
    """One rank's all-reduces, each completed but the last: (seq, elements) pairs."""
    events = []
    for index, (seq, size) in enumerate(seqs_and_sizes):
        events.append(enter(index + 1, "all_reduce", seq, group=group, shapes=[[size]],
                            where=f"s.py:{line if size != 1 else 8}"))
        if index + 1 < len(seqs_and_sizes):
            events.append({**DONE, "id": index + 1})
    return events


def test_a_parting_that_gloo_paired_is_proven_from_history():
    """Rank 0's extra all-reduce of 1 element met the others' #2 of 4, let rank 0 through,
    and every rank now blocks at the same line, rank 0 in #3, the others in #2: counted,
    the others wait for nobody; by history, nothing of that group after #2 can pair."""
    group = [0, 1, 2, 3]
    culprit = made([(0, 4), (1, 4), (2, 1), (3, 4)], group)
    others = [made([(0, 4), (1, 4), (2, 4)], group) for _ in range(3)]
    waits = state(culprit, *others, world=4)
    proof = waits.proof()
    assert (proof.kind, proof.ranks) == ("parted", (0, 1, 2, 3))
    assert "collective #2 of the default group parted" in proof.text
    assert "ranks 1-3 of 4 made all_reduce (#2, (4,), float32) at s.py:1" in proof.text
    assert "rank 0 made all_reduce (#2, (1,), float32) at s.py:8, an extra call" in proof.text


def test_a_parting_is_no_proof_while_a_rank_computes_or_a_call_can_return():
    group = [0, 1, 2]
    culprit = made([(0, 4), (1, 1), (2, 4)], group)
    assert state(culprit, made([(0, 4), (1, 4)], group), [], world=3).proof() is None
    # every member still inside the number where they parted: gloo pairs them
    assert state(made([(0, 4), (1, 1)], group), made([(0, 4), (1, 4)], group),
                 made([(0, 4), (1, 4)], group), world=3).proof() is None


def test_the_same_calls_in_every_rank_leave_no_history_behind():
    waits = state(*[made([(seq, 4) for seq in range(50)]) for _ in range(2)])
    assert waits.proof() is None
    assert waits.groups[((0, 1), None)].made == {}  # each number dropped once all made it
    waits.feed(0, json.dumps(enter(60, "all_reduce", 50), separators=(",", ":")).encode()
               + b"\n")
    assert list(waits.groups[((0, 1), None)].made) == [50]  # until rank 1 makes it
