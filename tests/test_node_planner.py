"""The node planner: one plan of cores for several models, checked with tables and against brute
force over every grouping of the models and every split of the cores."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from packrat.errors import NoPlanError
from packrat.machine.topology import Topology
from packrat.planning.node import (
    ModelLoad,
    NodePlanner,
    block_latencies,
    groupings,
    TURN_COST,
    plan_node,
    score,
    service_ms,
    transition,
)
from packrat.profiling.profiles import load

SHARED = Path(__file__).resolve().parents[2] / "shared" / "reference-profiles"
reference = pytest.mark.skipif(not SHARED.exists(), reason="reference profiles not present")

# L(t, b) of the 2-core VM (BENCHMARKS.md's magnitudes): one thread is superlinearly slow.
RESNET_VM = ((1, 1, 95.0), (2, 1, 52.0), (1, 2, 190.0), (2, 2, 100.0), (1, 4, 384.0), (2, 4, 198.0))
SQUEEZE_VM = ((1, 1, 25.0), (2, 1, 14.0), (1, 2, 48.0), (2, 2, 27.0), (1, 4, 95.0), (2, 4, 52.0))


def overlapping(plan) -> list[tuple[str, str]]:
    shares = plan.shares
    return [(a.model, b.model) for a, b in itertools.combinations(shares, 2) if set(a.cores) & set(b.cores)]


def check_invariants(plan, cores: int) -> None:
    """No core is time-shared without both models knowing (and locking); each plan fits its cores."""
    for a, b in overlapping(plan):
        assert b in plan.share(a).shared_with and a in plan.share(b).shared_with
    for share in plan.shares:
        assert set(share.cores) <= set(range(cores))
        used = [c for inst in share.plan.instances for c in inst.cores]
        assert len(used) == len(set(used)) and set(used) <= set(share.cores)
        assert sum(inst.batch for inst in share.plan.instances) == share.plan.batch


def brute_force_worst(loads: list[ModelLoad], cores: int) -> float:
    """The least worst score over every grouping of the busy models and every split of the cores."""
    service = [service_ms(m, cores) for m in loads]
    alone = [block_latencies([m], [s[cores]])[0] for m, s in zip(loads, service)]
    busy = [i for i, m in enumerate(loads) if not m.idle] or list(range(len(loads)))
    best = math.inf
    for grouping in partitions(busy):
        for split in itertools.product(range(1, cores + 1), repeat=len(grouping)):
            if sum(split) > cores:
                continue
            worst = 0.0
            for members, count in zip(grouping, split):
                latencies = block_latencies([loads[m] for m in members], [service[m][count] for m in members])
                worst = max(worst, *(score(loads[m], lat, alone[m]) for m, lat in zip(members, latencies)))
            best = min(best, worst)
    return best


def partitions(items: list[int]):
    """Set partitions, written independently of the module's (restricted growth strings)."""
    n = len(items)
    for labels in itertools.product(range(n), repeat=n):
        if all(labels[i] <= max(labels[:i], default=-1) + 1 for i in range(n)):
            yield [[items[i] for i in range(n) if labels[i] == k] for k in range(max(labels) + 1)]


def test_groupings_are_every_set_partition():
    found = sorted(sorted(map(sorted, g)) for g in groupings([0, 1, 2, 3], 4))
    assert len(found) == 15 and found == sorted(sorted(map(sorted, p)) for p in partitions([0, 1, 2, 3]))
    assert all(len(g) <= 2 for g in groupings([0, 1, 2, 3], 2)) and len(list(groupings([0, 1, 2, 3], 2))) == 8


def test_two_saturated_models_split_the_cores_of_the_vm():
    plan = plan_node([ModelLoad("resnet", RESNET_VM, 4), ModelLoad("squeeze", SQUEEZE_VM, 4)], 2)
    assert plan.share("resnet").cores != plan.share("squeeze").cores and not overlapping(plan)
    assert not plan.share("resnet").locked
    # each keeps about half of its throughput alone (the case): alone, 2×⟨1, 2⟩ is best
    assert plan.share("resnet").slowdown == pytest.approx(384 / 190)
    assert plan.share("squeeze").slowdown == pytest.approx(95 / 48)
    check_invariants(plan, 2)


def test_light_loads_take_turns_on_every_core():
    """Two light loads: both cores each, in turn, beats one slow core each."""
    plan = plan_node([ModelLoad("resnet", RESNET_VM, 4, rate=2.0), ModelLoad("squeeze", SQUEEZE_VM, 4, rate=8.0)], 2)
    assert plan.share("resnet").cores == plan.share("squeeze").cores == (0, 1)
    assert plan.share("resnet").locked and plan.share("squeeze").shared_with == ("resnet",)
    check_invariants(plan, 2)


def test_an_idle_model_keeps_a_warm_instance_and_gives_its_cores_away():
    plan = plan_node([ModelLoad("resnet", RESNET_VM, 4), ModelLoad("squeeze", SQUEEZE_VM, 4, rate=0.0)], 2)
    busy, idle = plan.share("resnet"), plan.share("squeeze")
    assert busy.cores == (0, 1) and busy.slowdown == pytest.approx(1.0)
    assert idle.idle and len(idle.cores) == 1 and [i.threads for i in idle.plan.instances] == [1]
    assert idle.shared_with == ("resnet",) and busy.shared_with == ("squeeze",)  # the warm core is taken in turns
    check_invariants(plan, 2)


def test_an_idle_model_takes_a_spare_core_alone():
    flat = ((1, 1, 10.0), (2, 1, 10.0), (3, 1, 10.0))  # more cores do not help: one stays spare
    plan = plan_node([ModelLoad("a", flat, 1), ModelLoad("b", flat, 1, rate=0.0)], 3)
    assert not plan.share("b").locked and not overlapping(plan)


def test_every_model_idle_is_planned_as_busy():
    plan = plan_node([ModelLoad("a", RESNET_VM, 4, rate=0.0), ModelLoad("b", SQUEEZE_VM, 4, rate=0.0)], 2)
    assert not any(share.idle for share in plan.shares)


def test_slo_objective_names_the_model_that_misses():
    loads = [ModelLoad("resnet", RESNET_VM, 4, slo_ms=150.0), ModelLoad("squeeze", SQUEEZE_VM, 4, slo_ms=200.0)]
    plan = plan_node(loads, 2)
    # 190 ms is ResNet's best even with both cores; on a core of its own it takes 384 ms, in turns
    # with SqueezeNet on both 190 × (100 + 48) × TURN_COST / 100: a turn of 100 ms against one of
    # SqueezeNet's 48 ms batches, its turn (turn_length). The plan keeps its miss smallest so.
    assert "resnet" in plan.missed_slo and plan.share("resnet").cores == (0, 1)
    assert plan.share("resnet").score == pytest.approx(190 * 148 * TURN_COST / 100 / 150)
    assert "SLO" in plan.objective and "resnet" in plan.to_json()["missed_slo"]
    met = plan_node([ModelLoad("resnet", RESNET_VM, 4, slo_ms=400.0), ModelLoad("squeeze", SQUEEZE_VM, 4, slo_ms=100.0)], 2)
    assert met.missed_slo == () and met.worst <= 1


def test_more_models_than_cores_take_turns():
    loads = [ModelLoad(name, SQUEEZE_VM, 4) for name in "abc"]
    plan = plan_node(loads, 2)
    assert len({s.cores for s in plan.shares}) <= 2 and overlapping(plan)
    check_invariants(plan, 2)


def test_a_profile_that_cannot_cover_the_batch_is_refused():
    with pytest.raises(NoPlanError, match="x: its profile cannot cover batch 16"):
        NodePlanner([ModelLoad("x", RESNET_VM, 16)], 2)


def test_a_turn_is_as_long_as_the_longest_request_on_its_block():
    """BERT's one request takes 280 ms on the core and cannot be cut: ResNet-50's turns there run
    280 ms too (three or four of its 75 ms requests), not the 100 ms quantum, so each gets half."""
    bert, resnet = ModelLoad("bert", ((1, 1, 280.0),), 1), ModelLoad("resnet", ((1, 4, 300.0),), 4)
    cycle = (280 + 280) * TURN_COST
    assert block_latencies([bert, resnet], [280.0, 300.0]) == pytest.approx([cycle, 300 * cycle / 280])
    plan = plan_node([bert, resnet], 1)
    assert [s.longest_request_ms for s in plan.shares] == [280.0, 280.0]
    assert plan.to_json()["models"]["resnet"]["longest_request_ms"] == 280.0
    alone = plan_node([resnet], 1)
    assert alone.share("resnet").longest_request_ms is None and alone.to_json()["models"]["resnet"]["longest_request_ms"] is None


def test_queueing_latency_rises_with_the_load():
    light, heavy = (ModelLoad("m", RESNET_VM, 4, rate=r) for r in (1.0, 15.0))
    (quiet,), (busy,) = block_latencies([light], [198.0]), block_latencies([heavy], [198.0])
    assert quiet == pytest.approx(198 + 0.25 * 0.198 * 198 / (2 * (1 - 0.25 * 0.198)))
    assert busy > quiet and block_latencies([ModelLoad("m", RESNET_VM, 4, rate=40.0)], [198.0]) == [198.0]


@reference
@pytest.mark.parametrize("resnet_rate,bert_rate", [(None, None), (20.0, 10.0), (100.0, 5.0), (5.0, 60.0), (0.0, None)])
def test_reference_tables_match_brute_force(resnet_rate, bert_rate):
    """ResNet + BERT on the 16-core tables at several load ratios: the search finds the least
    worst score that any grouping and any split of the cores gives."""
    resnet, bert = load(SHARED / "resnet_large-batches.csv").items(), load(SHARED / "bert_large-batches.csv").items()
    loads = [ModelLoad("resnet", tuple(resnet), 32, rate=resnet_rate), ModelLoad("bert", tuple(bert), 8, rate=bert_rate)]
    plan = plan_node(loads, 16)
    assert plan.worst == pytest.approx(brute_force_worst(loads, 16), rel=1e-9)
    check_invariants(plan, 16)


@reference
def test_three_models_on_eight_reference_cores_match_brute_force():
    tables = {name: tuple(load(SHARED / f"{name}_large-batches.csv").items()) for name in ("resnet", "bert", "inception")}
    loads = [ModelLoad("resnet", tables["resnet"], 8, rate=30.0), ModelLoad("bert", tables["bert"], 4),
             ModelLoad("inception", tables["inception"], 4, rate=10.0)]
    plan = plan_node(loads, 8, Topology.virtual(8, sockets=2))
    assert plan.worst == pytest.approx(brute_force_worst(loads, 8), rel=1e-9)
    check_invariants(plan, 8)


latencies = st.floats(min_value=1.0, max_value=500.0)


@st.composite
def model_loads(draw, name: str):
    batch = draw(st.sampled_from([1, 2, 4]))
    base = draw(latencies)
    items = tuple((t, b, base * b / t ** draw(st.floats(0.3, 1.0))) for t in (1, 2, 3, 4) for b in (1, 2, 4))
    rate = draw(st.one_of(st.none(), st.just(0.0), st.floats(0.1, 100.0)))
    return ModelLoad(name, items, batch, rate=rate)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 0), min_size=1, max_size=3).flatmap(
    lambda n: st.tuples(*(model_loads(f"m{i}") for i in range(len(n))))), st.integers(1, 4))
def test_any_loads_give_a_consistent_optimal_plan(loads, cores):
    plan = plan_node(list(loads), cores)
    check_invariants(plan, cores)
    assert plan.worst == pytest.approx(brute_force_worst(list(loads), cores), rel=1e-9)


def safe_between(before: dict, after: dict) -> bool:
    """Two members' cores overlap only where both take turns, whichever of the two steps each runs."""
    names = set(before) | set(after)
    for a, b in itertools.combinations(sorted(names), 2):
        for x in (before.get(a), after.get(a)):
            for y in (before.get(b), after.get(b)):
                if x and y and set(x[0]) & set(y[0]) and not (x[1] and y[1]):
                    return False
    return True


allocations = st.dictionaries(st.sampled_from("abcd"), st.tuples(
    st.lists(st.integers(0, 3), min_size=1, max_size=4, unique=True).map(lambda c: tuple(sorted(c))), st.booleans()),
    min_size=1, max_size=4).filter(lambda a: all(
        not (set(x[0]) & set(y[0])) or (x[1] and y[1]) for (m, x), (n, y) in itertools.combinations(a.items(), 2)))


@settings(max_examples=200, deadline=None)
@given(allocations, allocations)
def test_every_transition_step_is_safe_and_ends_at_the_new_plan(old, new):
    staying = {m: old[m] for m in old if m in new}  # a member missing from `new` has left already
    steps = transition(old, new)
    assert (steps[-1] if steps else staying) == new
    previous = staying
    for step in steps:
        assert safe_between(previous, step)
        previous = step


def test_a_donor_takes_turns_before_the_receiver_grows():
    old = {"a": ((0, 1), False), "b": ((2, 3), False)}
    new = {"a": ((0, 1, 2), False), "b": ((3,), False)}
    turns, move, settle = transition(old, new)
    assert turns == {"a": ((0, 1), True), "b": ((2, 3), True)}
    assert move == {"a": ((0, 1, 2), True), "b": ((3,), True)} and settle == new


def test_evaluate_counts_overlapping_cores_as_turns():
    loads = [ModelLoad("resnet", RESNET_VM, 4), ModelLoad("squeeze", SQUEEZE_VM, 4)]
    planner = NodePlanner(loads, 2)
    split = planner.plan().allocation()
    assert planner.evaluate(split) == pytest.approx(planner.plan().worst)
    overlapping_ = {"resnet": ((0, 1), True), "squeeze": ((1,), True)}
    # turns on both cores: SqueezeNet runs one 48 ms batch a cycle, ResNet-50 a 100 ms turn
    assert planner.evaluate(overlapping_) == pytest.approx((100 + 48) * TURN_COST / 48)
    assert planner.evaluate({"resnet": ((0, 1), False)}) == math.inf  # a busy model with no cores
