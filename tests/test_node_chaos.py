"""The node chaos run's judgements, on plain data: when the node is whole, and a fault window's figures."""

from __future__ import annotations

from packrat.bench.node_chaos import Fault, POLL_S, in_motion, moves_since, whole, window_figures
from packrat.loadtest.requestlog import RequestRecord

STATE = {"generation": 4, "step": 1, "steps": [{}, {}]}


def member(model: str, cores, locked: bool, applied=(4, 1)) -> dict:
    return {"model": model, "share": [list(cores), locked], "applied": list(applied)}


def test_whole_means_every_model_placed_and_apart_unless_in_turns():
    apart = [member("a", [0], False), member("b", [1], False)]
    assert whole(apart) and not whole([])
    assert not whole(apart + [{"model": "c", "share": None}])  # c has a worker but no cores yet
    assert whole([member("a", [0, 1], True), member("b", [1], True)])  # turns
    assert not whole([member("a", [0, 1], False), member("b", [1], True)])  # a does not take them


def test_a_move_is_under_way_until_every_member_applied_the_last_step():
    apart = [member("a", [0], False), member("b", [1], False)]
    assert not in_motion(STATE, apart) and not in_motion(None, apart)
    assert in_motion(STATE, [member("a", [0], False), member("b", [1], False, applied=(4, 0))])
    assert in_motion({**STATE, "step": 0}, [member("a", [0], False, applied=(4, 0))])


def test_a_windows_figures_count_what_was_sent_in_it():
    records = [RequestRecord(10.0 + i, 100.0 + i, 200, False) for i in range(100)] + \
              [RequestRecord(50.5, 3.0, 503, True, "no instance"), RequestRecord(500.0, 1.0, 500, True, "late")]
    figures = window_figures(records, 40.0, 60.0)
    assert figures["sent"] == 21 and figures["failed"] == 1 and figures["reasons"] == {"no instance": 1}
    assert figures["p99_ms"] == 149.0


def test_a_fault_is_whole_again_after_its_last_broken_sample():
    fault = Fault("owner-kill", started=100.0, ended=101.0)
    fault.samples = [(100.25, True, 1, False), (100.5, False, 1, True), (103.0, False, 2, True), (103.25, True, 2, False)]
    figures = fault.figures()
    assert figures["not_whole_s"] == figures["moving_s"] == 2 * POLL_S and figures["lease_epochs"] == [1, 2]
    assert figures["whole_again_s"] == 3.25 and figures["whole_after_fault_ended_s"] == 2.25
    assert figures["whole_at_end"]


def test_a_fault_window_says_whether_a_move_failed_in_it():
    state = {"moves": [{"started_at": 90.0, "seconds": 30.0, "failed": "old"},
                       {"started_at": 101.0, "seconds": 0.5, "failed": "b could not move: injected fault"},
                       {"started_at": 102.0, "seconds": 3.2, "failed": None, "kind": "hold"},
                       {"started_at": 115.0, "seconds": None, "failed": None}]}
    assert moves_since(state, 100.0) == ("3 move(s) of the node, 1 failed, the slowest 3.2 s "
                                         "(b could not move: injected fault)")
    assert moves_since(None, 0.0) == "0 move(s) of the node, 0 failed"
