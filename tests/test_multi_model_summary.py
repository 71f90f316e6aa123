"""packrat bench multi-model's pure parts (packrat/bench/multi_model.py and its report): the rounds'
order, phase statistics, throughput of alone within a round, the node's leads, medians with their
spread and the tables quoting them, from made-up figures (no processes). Quick tier: unmarked."""

from __future__ import annotations

from collections import namedtuple

import pytest

from packrat.bench.multi_model import (Phase, leads, normalised, of_alone, over_all_rounds, phase_windows, schedule,
                                       summarise)
from packrat.bench.rounds import median_spread, over_rounds

from packrat.bench import multi_model_run as multi_model
from packrat.cli.main import main

Record = namedtuple("Record", "start response_ms failed")


def config(figures: dict[str, dict[str, float]], users: int = 4, failed: int = 0) -> dict:
    """A configuration's summary as summarise gives it: {phase: {model: req/s}} at `users` each."""
    return {"phases": {phase: {"models": {m: {"requests": 10, "failures": failed, "p50_ms": 100.0, "p99_ms": 200.0,
                                              "rps": rps, "users": users} for m, rps in models.items()}}
                       for phase, models in figures.items()},
            "failed_requests": failed, "requests": 10 * sum(len(models) for models in figures.values())}


def one_round(alone: tuple[float, float], node: tuple[float, float], per_model: tuple[float, float]) -> dict:
    """One round's configurations: models a and b, req/s alone, under packrat-node and per-model."""
    return {"alone": config({"4 users": dict(zip("ab", alone))}),
            "packrat-node": config({"both": dict(zip("ab", node))}),
            "per-model": config({"both": dict(zip("ab", per_model))}, failed=1)}


def test_every_round_runs_alone_and_each_configuration_in_an_order_rotated_by_one():
    order = schedule(["packrat-node", "stock", "per-model"], 5)
    assert order[:3] == [["alone", "packrat-node", "stock", "per-model"],
                         ["packrat-node", "stock", "per-model", "alone"],
                         ["stock", "per-model", "alone", "packrat-node"]]
    assert order[4] == order[0]  # round r starts at index r mod k
    for place in range(4):  # over k rounds each takes every place once
        assert sorted(r[place] for r in order[:4]) == sorted(order[0])
    assert schedule(["stock"], 1) == [["alone", "stock"]]


def test_a_phase_is_counted_in_its_window_past_the_settling_seconds():
    phases = [Phase("warm-up", {"a": 4, "b": 4}, 10.0, 10.0, measured=False),
              Phase("loaded", {"a": 4, "b": 4}, 20.0, 5.0), Phase("b idle", {"a": 4, "b": 0}, 10.0, 0.0)]
    assert [(p.name, begin, end) for p, begin, end in phase_windows(phases, 100.0)] == \
        [("loaded", 116.0, 131.0), ("b idle", 131.0, 141.0)]
    records = [Record(105.0, 50.0, False),  # warm-up
               *[Record(116.0 + i, 100.0 + i, False) for i in range(15)], Record(120.0, 1.0, True),  # loaded
               Record(140.0, 80.0, False), Record(141.0, 80.0, False)]  # b idle, then past its end
    plans = [(110.0, {"a": 3.0}), (130.0, {"a": 1.5}), (135.0, {"a": 1.1})]
    summary = summarise(phases, {"a": (100.0, records), "b": (100.0, [Record(130.0, 10.0, True)])}, plans)
    loaded = summary["phases"]["loaded"]["models"]
    assert loaded["a"]["requests"] == 16 and loaded["a"]["failures"] == 1 and loaded["a"]["users"] == 4
    assert loaded["a"]["rps"] == pytest.approx(15 / 15.0) and loaded["a"]["p50_ms"] == pytest.approx(107.0)
    assert loaded["a"]["expected_slowdown"] == 1.5  # the plan seen by the phase's end
    assert loaded["b"]["requests"] == 1 and loaded["b"]["p50_ms"] != loaded["b"]["p50_ms"]  # NaN: no answer
    assert list(summary["phases"]["b idle"]["models"]) == ["a"]  # an idle model is not a row
    assert summary["phases"]["b idle"]["models"]["a"]["expected_slowdown"] == 1.1
    assert summary["failed_requests"] == 2 and summary["requests"] == 20
    assert "expected_slowdown" not in summarise(phases, {"a": (100.0, records)})["phases"]["loaded"]["models"]["a"]


def test_throughput_of_alone_is_the_same_rounds_and_the_lead_is_the_nodes_over_the_others():
    configs = one_round(alone=(20.0, 100.0), node=(10.0, 60.0), per_model=(8.0, 60.0))
    node = of_alone(configs["packrat-node"], configs["alone"])["phases"]["both"]
    assert node["models"]["a"]["of_alone"] == pytest.approx(0.5) and node["models"]["a"]["slowdown"] == pytest.approx(2)
    assert node["sum_of_alone"] == pytest.approx(1.1) and node["worst_slowdown"] == pytest.approx(2.0)
    done = normalised(configs)
    assert "of_alone" not in done["configs"]["alone"]["phases"]["4 users"]["models"]["a"]
    lead = done["leads"]["per-model"]["both"]
    assert lead["models"] == {"a": pytest.approx(0.5 / 0.4), "b": pytest.approx(1.0)}
    assert lead["worst"] == pytest.approx(0.5 / 0.4) and lead["sum"] == pytest.approx(1.1 / 1.0)
    assert list(done["leads"]) == ["per-model"]
    assert leads({c: s for c, s in done["configs"].items() if c != "packrat-node"}) == {}


def test_medians_over_rounds_with_their_spread_and_failures_summed():
    assert median_spread([3.0, None, 1.0, float("nan"), 2.0, "x"]) == {"median": 2.0, "spread": [1.0, 3.0]}
    assert median_spread([None]) is None
    merged = over_rounds([{"x": 1.0, "n": 2, "u": 4, "only": {"y": 5.0}}, {"x": 3.0, "n": 1, "u": 4},
                          {"x": 2.0, "n": 0, "u": 4}], summed=("n",), kept=("u",))
    assert merged == {"x": {"median": 2.0, "spread": [1.0, 3.0]}, "n": 3, "u": 4,
                      "only": {"y": {"median": 5.0, "spread": [5.0, 5.0]}}}
    # The VM at half speed in round 2, and the node better in round 3: each round normalised to its
    # own alone, then the median (not the ratio of the median throughputs, 10 / 20 = 0.5).
    rounds = [normalised(one_round((20.0, 100.0), (10.0, 60.0), (8.0, 60.0))),
              normalised(one_round((10.0, 50.0), (6.0, 30.0), (4.0, 30.0))),
              normalised(one_round((30.0, 100.0), (21.0, 60.0), (12.0, 50.0)))]
    summary = over_all_rounds(rounds)
    a = summary["configs"]["packrat-node"]["phases"]["both"]["models"]["a"]
    assert a["of_alone"] == {"median": pytest.approx(0.6), "spread": [pytest.approx(0.5), pytest.approx(0.7)]}
    assert a["rps"] == {"median": 10.0, "spread": [6.0, 21.0]} and a["users"] == 4 and a["requests"] == 30
    assert summary["configs"]["per-model"]["failed_requests"] == 3 and a["failures"] == 0
    assert summary["leads"]["per-model"]["both"]["models"]["a"]["median"] == pytest.approx(1.5)
    assert summary["leads"]["per-model"]["both"]["sum"]["spread"] == [pytest.approx(1.1), pytest.approx(1.3 / 0.9)]


def test_the_tables_quote_every_figure_with_its_spread():
    rounds = [{"round": i + 1, "order": order, **normalised(one_round(*figures)),
               "node": {"moves": [{"reason": "load shifted", "seconds": 1.25}]} if i == 0 else {}}
              for i, (order, figures) in enumerate(zip(schedule(["packrat-node", "per-model"], 3),
                                                       [((20.0, 100.0), (10.0, 60.0), (8.0, 60.0)),
                                                        ((10.0, 50.0), (6.0, 30.0), (4.0, 30.0)),
                                                        ((30.0, 100.0), (21.0, 60.0), (12.0, 50.0))]))]
    text = multi_model.report({"part": "targets", "rounds": 3, "summary": over_all_rounds(rounds), "per_round": rounds})
    assert "| packrat-node | both | a | 4 | 0 of 30 | 100 (100–100) | 200 (200–200) | 10.0 (6.0–21.0) | " \
           "0.60 (0.50–0.70) | 1.67 (1.43–2.00) | - |" in text
    assert "| alone | 4 users | a | 4 | 0 of 30 | 100 (100–100) | 200 (200–200) | 20.0 (10.0–30.0) | - | - | - |" \
        in text
    assert "| packrat-node | both | sum / worst |" in text
    assert "| both | a | 1.50 (1.25–1.75) |" in text  # the node's lead over per-model
    assert "| both | worst model | 1.50 (1.25–1.50) |" in text and "| both | sum |" in text
    assert "per-model 3 of 60" in text
    assert "round 1: alone, packrat-node, per-model; node moves: load shifted (1.25 s)" in text
    assert "round 2: packrat-node, per-model, alone" in text


def test_rounds_below_one_and_a_pair_of_three_are_refused():
    with pytest.raises(SystemExit) as exited:
        main(["bench", "multi-model", "--rounds", "0"])
    assert exited.value.code == 2
    with pytest.raises(SystemExit, match="--pair names two models"):
        main(["bench", "multi-model", "--pair", "tiny,tiny,tiny"])
