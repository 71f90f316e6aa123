"""Near-ties settled before serving: the candidates a profile cannot tell apart, and the verdict
from paired rounds (planning/settling.py), with tables; the settlement's line (serving/settling.py)."""

from __future__ import annotations

import pytest

from packrat.machine.topology import Topology
from packrat.planning.settling import (ESTIMATE_NOISE, MAX_CANDIDATES, candidates, fat_estimates, held, near_tie,
                                       round_order, rounds_to_decide, tail_probability, verdict)

OV, ORT, ORT_THREAD, IND = "openvino", "onnxruntime", "onnxruntime-thread", "inductor"


def figures(table: dict, spread: float = 0.3) -> dict:
    """(t, b, runtime) -> (ms, spread): a number alone gets `spread`."""
    return {key: value if isinstance(value, tuple) else (value, spread) for key, value in table.items()}


def chosen(points: dict, preference=(IND, OV, ORT, ORT_THREAD)) -> dict:
    """Each ⟨t, b⟩'s runtime as the profile would choose it here: the first of `preference` measured there."""
    found = {}
    for t, b, r in sorted(points, key=lambda k: preference.index(k[2])):
        found.setdefault((t, b), r)
    return found


def labels_of(points: dict, threads: int, batch: int, runtimes: dict | None = None, **more) -> list[tuple[str, str]]:
    found = candidates(points, runtimes or chosen(points), threads, batch, Topology.virtual(threads), **more)
    return [(c.plan.describe(), c.why) for c in found]


FAT_OV, FAT_ORT = "1×⟨2 threads, batch 1, openvino⟩", "1×⟨2 threads, batch 1, onnxruntime⟩"


@pytest.mark.parametrize("table, expected", [
    # the 2026-12-01 case: OpenVINO chosen, ONNX Runtime 2 % behind it: within the noise, timed
    ({(2, 1, OV): 29.0, (2, 1, ORT): 29.6, (1, 1, OV): 55.0, (1, 1, ORT): 56.0},
     [(FAT_OV, "the profile's plan"), (FAT_ORT, "onnxruntime's best")]),
    # ahead beyond both spreads and the floor: the profile is trusted, nothing to time
    ({(2, 1, OV): (29.0, 0.1), (2, 1, ORT): (31.0, 0.1)}, [(FAT_OV, "the profile's plan")]),
    # the same lead, but noisy points: a near-tie
    ({(2, 1, OV): (29.0, 0.8), (2, 1, ORT): (31.0, 0.8)},
     [(FAT_OV, "the profile's plan"), (FAT_ORT, "onnxruntime's best")]),
    # spreads never stretch a tie past MAX_TIE (25 %)
    ({(2, 1, OV): (29.0, 10.0), (2, 1, ORT): (37.0, 10.0)}, [(FAT_OV, "the profile's plan")]),
    # a runtime chosen by preference while another is a little faster: the faster one is timed
    ({(2, 1, IND): 30.0, (2, 1, ORT): 29.6},
     [("1×⟨2 threads, batch 1⟩", "the profile's plan"), (FAT_ORT, "onnxruntime's best")]),
])
def test_candidates_are_the_plans_within_the_noise_of_the_fastest(table, expected):
    assert labels_of(figures(table), 2, 1) == expected


def test_other_shapes_and_both_kinds_of_a_runtime_are_candidates():
    shapes = figures({(2, 4, IND): 100.0, (1, 2, IND): 101.0, (1, 4, IND): 190.0}, spread=1.0)
    assert labels_of(shapes, 2, 4) == [("1×⟨2 threads, batch 4⟩", "the profile's plan"),
                                       ("2×⟨1 threads, batch 2⟩", "other shapes")]
    kinds = figures({(2, 4, ORT): 100.0, (2, 4, ORT_THREAD): 99.5})
    assert labels_of(kinds, 2, 4) == [("1×⟨2 threads, batch 4, onnxruntime⟩", "the profile's plan"),
                                      ("1×⟨2 threads, batch 4, onnxruntime-thread⟩", "onnxruntime-thread's best")]


def test_a_split_plan_brings_each_runtimes_fat_instance_when_it_ties():
    points = figures({(1, 2, OV): 100.0, (2, 4, OV): 101.0, (2, 4, ORT): 101.5, (1, 2, ORT): 120.0}, spread=1.0)
    assert labels_of(points, 2, 4) == [("2×⟨1 threads, batch 2, openvino⟩", "the profile's plan"),
                                       ("1×⟨2 threads, batch 4, openvino⟩", "other shapes"),
                                       ("1×⟨2 threads, batch 4, onnxruntime⟩", "onnxruntime's best")]
    assert labels_of(points, 2, 4, fat_only=True) == [("1×⟨2 threads, batch 4, openvino⟩", "the profile's plan"),
                                                      ("1×⟨2 threads, batch 4, onnxruntime⟩", "onnxruntime's best")]


def test_a_fat_instance_the_profile_skipped_is_estimated_and_timed():
    """The 2026-12-03 ResNet-50 profile: ⟨2, 1⟩ and ⟨2, 8⟩ measured, ⟨2, 4⟩ under no runtime; the plan
    2×⟨1, 2⟩ at 95.2 ms, while one OpenVINO session served 73.3."""
    points = figures({(2, 1, OV): 19.8, (2, 8, OV): 160.5, (1, 1, OV): 73.6, (1, 8, OV): 365.4,
                      (1, 2, ORT): 95.2, (1, 1, ORT): 42.3, (2, 1, ORT): 21.5, (2, 8, ORT): 168.2}, spread=2.0)
    found = candidates(points, chosen(points), 2, 4)
    assert [(c.plan.describe(), c.why) for c in found] == [
        ("2×⟨1 threads, batch 2, onnxruntime⟩", "the profile's plan"),
        ("1×⟨2 threads, batch 4, openvino⟩", "openvino's fat instance, estimated"),
        ("1×⟨2 threads, batch 4, onnxruntime⟩", "onnxruntime's fat instance, estimated")]
    ms = 19.8 + (160.5 - 19.8) * 3 / 7  # on the line through batches 1 and 8
    assert found[1].expected_ms == pytest.approx(ms)
    assert found[1].spread_ms == pytest.approx(2.0 + ESTIMATE_NOISE * ms)


@pytest.mark.parametrize("line, batch, expected", [
    ({1: 10.0, 8: 80.0}, 4, 40.0),  # between two measured batches
    ({1: 10.0, 2: 20.0, 8: 80.0}, 4, 40.0),  # the nearest either side
    ({1: 10.0, 8: 80.0}, 16, 160.0),  # beyond them: the line through the two largest below
    ({1: 10.0, 8: 5.0}, 16, 10.0),  # never faster than a smaller batch measured
    ({8: 80.0}, 4, None),  # one batch measured: no line
])
def test_a_fat_instance_is_estimated_on_the_line_through_two_measured_batches(line, batch, expected):
    points = figures({(2, b, OV): ms for b, ms in line.items()} | {(1, batch, OV): 1.0}, spread=0.0)
    found = fat_estimates(points, 2, batch)
    assert (found[2, batch, OV][0] if found else None) == pytest.approx(expected)
    assert fat_estimates(points | figures({(2, batch, OV): 3.0}), 2, batch) == {}  # measured: not estimated
    assert held(points, (2, batch, OV)) == (expected is not None)


def test_candidates_are_bounded_the_profiles_plan_first_then_the_fastest():
    runtimes = (IND, OV, ORT, ORT_THREAD, "torch-compile")
    points = figures({(2, 1, r): 30.0 - 0.1 * i for i, r in enumerate(runtimes)})
    found = candidates(points, {(2, 1): IND}, 2, 1)
    assert len(found) == MAX_CANDIDATES and found[0].why == "the profile's plan"
    assert [c.expected_ms for c in found[1:]] == sorted(c.expected_ms for c in found[1:]) == [29.6, 29.7, 29.8]


def test_no_candidate_where_the_profile_cannot_plan_the_batch():
    assert candidates(figures({(2, 2, ORT): 10.0}), {(2, 2): ORT}, 2, 3) == []


@pytest.mark.parametrize("best, best_spread, other, other_spread, tie", [
    (100.0, 0.0, 102.0, 0.0, True),  # the floor: 2 %
    (100.0, 0.0, 102.1, 0.0, False),
    (100.0, 1.0, 104.0, 1.0, True),  # spreads added to it
    (100.0, 1.0, 104.1, 1.0, False),
    (100.0, 20.0, 125.0, 20.0, True),  # capped at 25 %
    (100.0, 20.0, 125.1, 20.0, False),
])
def test_a_near_tie_is_within_both_spreads_and_the_floor_up_to_the_cap(best, best_spread, other, other_spread, tie):
    assert near_tie(best, best_spread, other, other_spread) is tie


# ---- the verdict ----------------------------------------------------------------------------------

A, B, C = "profile's plan", "challenger", "third"


def rounds_of(*pairs) -> list[dict]:
    """Rounds from (A ms, B ms[, C ms]) tuples."""
    return [dict(zip((A, B, C), values)) for values in pairs]


@pytest.mark.parametrize("table, max_rounds, winner, done", [
    # faster in every one of 5 rounds by 3 %: a win (1 in 32 on a coin)
    ([(100, 97)] * 5, 10, B, True),
    # faster in 4 of 5: not yet beyond a coin toss; with rounds left it stays open
    ([(100, 97)] * 4 + [(100, 101)], 10, A, False),
    # ... and when no rounds are left, the profile's plan stands
    ([(100, 97)] * 4 + [(100, 101)], 5, A, True),
    # faster in every round by 0.5 %: below MIN_LEAD, level
    ([(100, 99.5)] * 10, 10, A, True),
    # slower twice from the start: it can no longer win in 10 rounds: done after 2
    ([(100, 103), (100, 102)], 10, A, True),
    # the profile's plan faster every round: it stands
    ([(97, 100)] * 5, 10, A, True),
])
def test_a_challenger_wins_only_beyond_a_coin_toss(table, max_rounds, winner, done):
    found = verdict(rounds_of(*table), [A, B], max_rounds)
    assert (found.winner, found.done) == (winner, done)


def test_a_coin_toss_is_no_win_however_the_medians_fall():
    """Alternating rounds: the challenger's median is lower, but it is faster in half the rounds only."""
    table = [(100, 95), (100, 101)] * 5
    found = verdict(rounds_of(*table), [A, B], 10)
    assert found.medians_ms[B] < found.medians_ms[A] and found.winner == A and found.done
    assert found.others[B]["faster_in"] == 5 and found.others[B]["of"] == 10


def test_the_significance_is_shared_over_the_challengers():
    """Three candidates: 5 rounds of 5 (1 in 32) no longer suffice (0.05 / 2 challengers); 6 do."""
    five = verdict(rounds_of(*[(100, 97, 101)] * 5), [A, B, C], 10)
    assert five.winner == A and not five.done and five.open == (B,)
    six = verdict(rounds_of(*[(100, 97, 101)] * 6), [A, B, C], 10)
    assert six.winner == B and six.done
    assert rounds_to_decide(2) == 5 and rounds_to_decide(3) == 6 and rounds_to_decide(4) == 6


def test_a_winner_must_beat_the_one_before_it_in_turn():
    """C beats B, B beats A: C is served; against it A and B are counted."""
    found = verdict(rounds_of(*[(100, 97, 94)] * 6), [A, B, C], 6)
    assert found.winner == C and found.done
    assert found.others[A]["ratio"] == pytest.approx(100 / 94) and found.others[B]["faster_in"] == 0


def test_a_candidate_timed_in_fewer_rounds_is_paired_on_those_only():
    rounds = rounds_of(*[(100, 97, 103)] * 2) + [{A: 100, B: 97}] * 3
    found = verdict(rounds, [A, B, C], 6)
    assert found.winner == A and found.others[C]["of"] == 2 and found.others[B]["of"] == 5


def test_tail_probabilities_and_the_order_of_rounds():
    assert tail_probability(5, 5) == 1 / 32 and tail_probability(0, 4) == 1.0
    assert tail_probability(9, 10) == pytest.approx(11 / 1024)
    assert round_order([A, B, C], 0) == [A, B, C] and round_order([A, B, C], 1) == [C, B, A]
    assert verdict([], [A], 10).done and verdict([], [A, B], 10).open == (B,)


# ---- the runner and the remembered settlements (serving/settling.py), with pools of plain objects -----

from types import SimpleNamespace  # noqa: E402

from packrat.serving.pool.api import Answer  # noqa: E402
from packrat.serving.settling import ITERS, WARMUP, Pools, SettledPlans, batches_to_settle, settle  # noqa: E402


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FakePool:
    """A pool whose every batch takes `ms` on the clock (the n-th batch ms(n) where a function)."""

    def __init__(self, clock: Clock, ms, fallbacks=()):
        self.clock, self.ms, self.fallbacks, self.batches = clock, ms, list(fallbacks), 0
        self.reconfigured, self.closed = [], False

    def infer(self, requests):
        ms = self.ms(self.batches) if callable(self.ms) else self.ms
        self.clock.now += ms / 1e3
        self.batches += 1
        return [Answer(200, b"{}")] * len(requests)

    def health(self):
        return SimpleNamespace(fallbacks=self.fallbacks)

    def reconfigure(self, configs):
        self.reconfigured.append(configs)

    def close(self):
        self.closed = True


def tied_at(batch: int, ov_ms: float = 29.0, ort_ms: float = 29.6):
    points = figures({(2, batch, OV): ov_ms, (2, batch, ORT): ort_ms})
    return candidates(points, chosen(points), 2, batch, Topology.virtual(2))


def fake_pools(clock: Clock, ms_by_runtime: dict, **fallbacks) -> Pools:
    return Pools(lambda configs: FakePool(clock, ms_by_runtime[configs[0].runtime], fallbacks.get(configs[0].runtime, ())),
                 capacity=8)


def test_a_challenger_faster_in_every_round_is_served_and_said_why():
    clock = Clock()
    pools = fake_pools(clock, {OV: 30.4, ORT: 27.6})
    found = settle(tied_at(1), pools, [None], 60.0, (0, 1), clock=clock, wall=lambda: 1000.0)
    assert found.plan.describe() == FAT_ORT and found.why == "onnxruntime's best" and found.changed
    assert found.rounds == 5 and found.decided and found.at == 1000.0
    assert found.line() == (f"settled B=1 on {FAT_ORT} (onnxruntime's best): 27.6 ms against {FAT_OV} (the profile's "
                            f"plan) 30.4 ms, 0 of 5 rounds faster (5 rounds, {found.seconds:.1f} s)")


def test_a_level_challenger_leaves_the_profiles_plan_and_a_slow_one_is_dropped_early():
    clock = Clock()
    by_round = lambda n: 29.0 if (n - WARMUP) // (1 + ITERS) % 2 else 31.0  # noqa: E731: faster every other round
    level = settle(tied_at(1), fake_pools(clock, {OV: 30.0, ORT: by_round}), [None], 60.0, (0, 1), clock=clock)
    # slower in 2 of the first 3 rounds: it can no longer win in 10, and the rounds end
    assert level.plan.describe() == FAT_OV and not level.changed and level.decided and level.rounds == 3
    slow = settle(tied_at(1), fake_pools(clock, {OV: 30.0, ORT: 33.0}), [None], 60.0, (0, 1), clock=clock)
    assert slow.plan.describe() == FAT_OV and slow.rounds == 2 and slow.decided


def test_the_time_given_bounds_the_rounds_and_no_winner_comes_of_too_few():
    clock = Clock()
    found = settle(tied_at(1), fake_pools(clock, {OV: 30.4, ORT: 27.6}), [None], 0.5, (0, 1), clock=clock)
    assert found.plan.describe() == FAT_OV and not found.decided and 0 < found.rounds < 5
    assert found.line().endswith("rounds ran out)")
    slow_start = Pools(lambda configs: clock.__setattr__("now", clock.now + 5.0) or FakePool(clock, 30.0), 8)
    found = settle(tied_at(1), slow_start, [None], 3.0, (0, 1), clock=clock)
    assert found.rounds == 0 and found.left_out == [f"{FAT_ORT}: no time left to start it"]


def test_a_candidate_that_falls_back_is_left_out_and_said():
    clock = Clock()
    pools = fake_pools(clock, {OV: 30.4, ORT: 27.6}, onnxruntime=["instance 0 runs inductor: not installed"])
    found = settle(tied_at(1), pools, [None], 60.0, (0, 1), clock=clock)
    assert found.plan.describe() == FAT_OV and found.rounds == 0
    assert found.left_out == [f"{FAT_ORT}: PoolError: runs another runtime than planned (instance 0 runs inductor: "
                              f"not installed)"]
    assert found.line().startswith(f"settled B=1 on {FAT_OV} (the profile's plan): not timed against nothing")


def test_pools_start_once_per_set_of_instances_and_hand_the_winners_over():
    clock = Clock()
    pools = fake_pools(clock, {OV: 30.4, ORT: 27.6})
    settle(tied_at(1), pools, [None], 60.0, (0, 1), clock=clock)
    four = tied_at(4, 120.0, 110.0)
    settle(four, pools, [None] * 4, 60.0, (0, 1), clock=clock)
    started = [p for same in pools.pools.values() for p in same]
    assert len(started) == 2 and all(len(p.reconfigured) == 1 for p in started)
    winner = pools.take(four[1].plan, 8)
    assert winner is not None and len(winner.reconfigured) == 2 and pools.take(four[1].plan, 8) is None
    pools.close()
    assert not winner.closed and all(p.closed for p in started if p is not winner)


def test_two_plans_of_the_same_instances_with_other_shares_get_a_pool_each():
    points = figures({(1, 1, IND): 50.0, (1, 3, IND): 100.0, (1, 2, IND): 99.0, (2, 4, IND): 180.0}, spread=1.0)
    tied = candidates(points, chosen(points), 2, 4, Topology.virtual(2))
    assert [c.label for c in tied] == ["2×⟨1 threads, batch 2⟩", "1×⟨1 threads, batch 3⟩ + 1×⟨1 threads, batch 1⟩"]
    clock, started = Clock(), []
    pools = Pools(lambda configs: started.append(FakePool(clock, sum(c.batch for c in configs))) or started[-1], 8)
    settle(tied, pools, [None] * 4, 60.0, (0, 1), clock=clock)
    assert len(started) == 2 and not any(p.reconfigured for p in started)


def test_a_settled_plan_stands_until_the_profiles_plan_moves_or_is_served():
    clock = Clock()
    found = settle(tied_at(1), fake_pools(clock, {OV: 30.4, ORT: 27.6}), [None], 60.0, (0, 1), clock=clock,
                   wall=lambda: 1000.0)
    settled = SettledPlans()
    settled.add(found)
    profile_plan, points = tied_at(1)[0].plan, {(2, 1, OV), (2, 1, ORT)}
    assert settled.plan(profile_plan, (0, 1), points, {}).describe() == FAT_ORT
    assert settled.plan(profile_plan, (0,), points, {}) is profile_plan  # other cores
    assert settled.plan(profile_plan, (0, 1), {(2, 1, OV)}, {}) is profile_plan  # its runtime left out
    # its runtime held at two other batches on as many threads: an estimated fat instance, still served
    assert settled.plan(profile_plan, (0, 1), {(2, 1, OV), (2, 2, ORT), (2, 8, ORT)}, {}).describe() == FAT_ORT
    assert settled.plan(profile_plan, (0, 1), points, {(2, 1, OV): 999.0}).describe() == FAT_ORT  # kept before
    assert settled.plan(profile_plan, (0, 1), points, {(2, 1, OV): 1001.0}) is profile_plan  # served since
    other = candidates(figures({(2, 1, ORT): 29.0}), {(2, 1): ORT}, 2, 1)[0].plan
    assert settled.plan(other, (0, 1), points, {}) is other  # the profile's plan moved
    assert settled.status()[0]["line"] == found.line()


@pytest.mark.parametrize("start, max_batch, follows, expected", [
    (8, 8, True, [8, 4, 2, 1]),
    (4, 8, True, [4, 2, 8, 1]),
    (6, 6, True, [6, 4, 2, 1]),
    (4, 8, False, [4]),
])
def test_the_batches_settled_are_those_the_engine_may_serve_nearest_first(start, max_batch, follows, expected):
    assert batches_to_settle(start, max_batch, follows) == expected


@pytest.mark.integration
def test_an_engine_settles_a_near_tie_before_serving_and_serves_the_winner(tmp_path, caplog):
    """tiny's profile has the fat instance and two 1-thread instances level at B = 4: the engine
    times both before it serves, serves the winner (whichever it is), says so in its log and status,
    and a switch back to B = 4 serves it again without timing anything."""
    import logging
    import os

    from packrat.serving.engine import Engine
    from packrat.serving.pool.api import Request
    from packrat.settings import Settings

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 cores")
    (tmp_path / "profile.csv").write_text("# model: tiny\n# mode: eager\nthreads,batch,latency_ms,mad_ms\n"
                                          "1,2,1.0,0.05\n2,4,1.0,0.05\n1,4,5.0,0.05\n2,2,5.0,0.05\n")
    settings = Settings(model="tiny", profiles=("profile.csv",), max_batch=4, share_node=False, reconfigure=False,
                        cores=2, settle_s=20)
    with caplog.at_level(logging.INFO, logger="packrat.serving.engine"):
        engine = Engine(settings, tmp_path, "tiny", max_batch=4, asynchronous=False)
    try:
        (settled,) = engine.status()["settled"]
        assert settled["batch"] == 4 and settled["profile_plan"] == "1×⟨2 threads, batch 4⟩"
        assert {c["label"] for c in settled["candidates"]} == {"1×⟨2 threads, batch 4⟩", "2×⟨1 threads, batch 2⟩"}
        assert settled["rounds"] >= 1 and engine.controller.plan.describe() == settled["plan_text"]
        assert any(r.message == f"packrat {settled['line']}" for r in caplog.records)
        body = bytes(3 * 32 * 32 * 4)
        assert [f.result(30).status for f in [engine.submit(Request(body, "application/octet-stream"))
                                              for _ in range(4)]] == [200] * 4
        assert engine.controller.request(4, "back to the same batch")
        engine.controller.wait_idle(30)
        assert engine.controller.plan.describe() == settled["plan_text"] and len(engine.status()["settled"]) == 1
    finally:
        engine.close()


def a_settlement(batch: int = 1):
    clock = Clock()
    return settle(tied_at(batch), fake_pools(clock, {OV: 30.4, ORT: 27.6}), [None] * batch, 60.0, (0, 1),
                  clock=clock, wall=lambda: 1000.0)


def test_plan_settle_prints_the_winner_and_the_verdict(tmp_path, monkeypatch, capsys):
    import json

    from packrat.cli.main import main
    from packrat.serving import settling

    profile = tmp_path / "p.csv"
    profile.write_text("# model: tiny\nthreads,batch,latency_ms,runtime,mad_ms\n2,1,29.0,openvino,0.3\n"
                       "2,1,29.6,onnxruntime,0.3\n")
    asked = []
    monkeypatch.setattr(settling, "model_pools", lambda model, mode, capacity: SimpleNamespace(close=lambda: None))
    monkeypatch.setattr(settling, "settle_batches", lambda profile, spec, pools, topology, batches, time_s, **_:
                        asked.append((batches, time_s)) or [a_settlement()])
    assert main(["plan", "--profile", str(profile), "--threads", "2", "--batch", "1", "--settle", "--settle-s", "9"]) == 0
    out = capsys.readouterr().out
    assert asked == [([1], 9.0)] and "onnxruntime" in out.splitlines()[0] and out.rstrip().endswith(a_settlement().line())
    assert main(["plan", "--profile", str(profile), "--threads", "2", "--batch", "1", "--settle", "--json"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert body["instances"][0]["runtime"] == ORT and body["settled"]["plan_text"] == FAT_ORT
    assert body["settled"]["candidates"][0]["faster_in"] == 0  # the profile's plan, against the winner


def test_status_prints_each_settlement(monkeypatch, capsys, tmp_path):
    from packrat.cli.main import main
    from packrat.deploy import torchserve

    status = {"plan": {"batch": 1, "threads": 2, "instances": [{"threads": 2, "batch": 1, "cores": [0, 1]}]},
              "mode": "compile", "reconfigurations": [], "settled": [a_settlement().to_json()]}
    monkeypatch.setattr(torchserve.Server, "load", classmethod(lambda cls, run_dir: SimpleNamespace(models=("tiny",))))
    monkeypatch.setattr(torchserve, "handler_status", lambda server, model=None: status)
    assert main(["status", "--run-dir", str(tmp_path)]) == 0
    assert a_settlement().line() in capsys.readouterr().out
