"""packrat bench oracle (packrat/bench/oracle.py), its pure parts: enumeration, selection, estimates, report and verdicts."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings, strategies as st

from packrat.bench import oracle, oracle_configs, oracle_report
from packrat.cli.main import main
from packrat.machine.topology import Topology
from packrat.profiling.profiles import Profile



def brute_force(threads, batch):
    """Every multiset of ⟨t, b⟩ with Σt ≤ T, Σb = B, by filtering all small multisets."""
    shapes = [(t, b) for t in range(1, threads + 1) for b in range(1, batch + 1)]
    found = set()
    for k in range(1, min(threads, batch) + 1):
        for combo in itertools.combinations_with_replacement(shapes, k):
            if sum(t for t, _ in combo) <= threads and sum(b for _, b in combo) == batch:
                found.add(oracle_configs.arrange(combo))
    return found


# ---- all_configs ------------------------------------------------------------------------------

@pytest.mark.parametrize("batch, count", [(1, 2), (2, 3), (4, 4), (8, 6), (16, 10)])
def test_two_cores_counts(batch, count):
    """On 2 cores: ⟨1,B⟩, ⟨2,B⟩ and ⟨1,b⟩ + ⟨1,B−b⟩ for 1 ≤ b ≤ B/2."""
    configs = oracle_configs.all_configs(2, batch)
    assert len(configs) == count == batch // 2 + 2
    expected = {((2, batch),), ((1, batch),)} | {oracle_configs.arrange([(1, b), (1, batch - b)])
                                                  for b in range(1, batch // 2 + 1)}
    assert set(configs) == expected


@pytest.mark.parametrize("threads, batch, count", [(1, 1, 1), (1, 5, 1), (3, 1, 3), (3, 3, 7), (4, 16, 161),
                                                   (8, 16, 4571)])
def test_known_counts(threads, batch, count):
    assert len(oracle_configs.all_configs(threads, batch)) == count


@pytest.mark.parametrize("threads, batch", [(1, 3), (2, 5), (3, 4), (4, 4), (3, 6), (5, 3)])
def test_matches_brute_force(threads, batch):
    configs = oracle_configs.all_configs(threads, batch)
    assert len(configs) == len(set(configs))  # no duplicates
    assert set(configs) == brute_force(threads, batch)


@given(st.integers(1, 6), st.integers(1, 8))
@settings(max_examples=60, deadline=None)
def test_constraints_and_canonical(threads, batch):
    configs = oracle_configs.all_configs(threads, batch)
    assert len(configs) == len(set(configs))
    for config in configs:
        assert oracle_configs.feasible(config, threads, batch)
        assert config == oracle_configs.arrange(config)


def test_limit():
    assert oracle_configs.all_configs(4, 16, limit=161) is not None
    assert oracle_configs.all_configs(4, 16, limit=160) is None
    assert oracle_configs.all_configs(16, 16, limit=1000) is None  # stops early: 237,034 exist
    assert oracle_configs.all_configs(0, 4) == [] and oracle_configs.all_configs(4, 0) == []


# ---- select_configs ----------------------------------------------------------------------------

def test_select_everything_when_few():
    configs, feasible = oracle_configs.select_configs(2, 16, 40)
    assert feasible == 10 and set(configs) == {oracle_configs.canonical(c) for c in oracle_configs.all_configs(2, 16)}


@pytest.mark.parametrize("threads, batch, cap", [(4, 16, 40), (4, 16, 5), (8, 16, 40), (8, 16, 3), (16, 16, 40),
                                                 (32, 64, 40), (64, 64, 10)])
def test_select_bounded(threads, batch, cap):
    fat = oracle_configs.canonical([(threads, batch)])
    odd = oracle_configs.canonical([(1, batch - 1), (1, 1)])  # unbalanced: ranked near the end
    configs, feasible = oracle_configs.select_configs(threads, batch, cap, keep=[fat, odd, odd])
    assert len(configs) == len(set(configs)) <= cap + 2  # the cap counts beyond the two kept
    assert fat in configs and odd in configs  # the planner's choices always kept
    assert all(oracle_configs.feasible(c, threads, batch) for c in configs)
    assert configs == sorted(configs, key=lambda c: oracle_configs.rank_key(c, threads, batch))
    if feasible is not None:
        assert feasible == len(oracle_configs.all_configs(threads, batch))
    again, _ = oracle_configs.select_configs(threads, batch, cap, keep=[odd, fat])
    assert again == configs  # deterministic


def test_select_keeps_and_the_cap_counts_beyond():
    keep = [oracle_configs.canonical(c) for c in [((4, 16),), ((2, 8), (2, 8)), ((1, 4),) * 4]]
    configs, _ = oracle_configs.select_configs(4, 16, 2, keep=keep)
    assert set(keep) <= set(configs) and len(configs) == 5


def test_on_16_cores_the_oracle_times_every_filling_identical_configuration_and_the_plans_neighbours():
    runtimes = ("inductor", "onnxruntime", "openvino")
    plan = oracle_configs.canonical([(4, 4, "onnxruntime")] * 2 + [(2, 2, "openvino")] * 4)  # 16 threads, B = 16
    required = oracle_configs.required_configs(16, 16, runtimes, [plan])
    for runtime in runtimes:  # 1, 2, 4, 8 and 16 identical instances under each runtime, fat among them
        for config in oracle_configs.identical_configs(16, 16):
            assert oracle_configs.canonical(config, runtime) in required
    assert plan in required
    one_away = {
        oracle_configs.canonical([(4, 4, "onnxruntime"), (4, 4, "inductor")] + [(2, 2, "openvino")] * 4),  # a runtime
        oracle_configs.canonical([(5, 4, "onnxruntime"), (3, 4, "onnxruntime")] + [(2, 2, "openvino")] * 4),  # a thread
        oracle_configs.canonical([(4, 5, "onnxruntime"), (4, 4, "onnxruntime"), (2, 1, "openvino")]
                         + [(2, 2, "openvino")] * 3),  # a request
    }
    assert one_away <= set(required)
    assert all(oracle_configs.feasible(c, 16, 16) for c in required) and len(required) == len(set(required))
    configs, _ = oracle_configs.select_configs(16, 16, 10, keep=required, runtimes=runtimes)
    assert set(required) <= set(configs) and len(configs) == len(required) + 10


def test_select_spans_instance_counts():
    configs, _ = oracle_configs.select_configs(8, 16, 12)
    counts = {len(c) for c in configs}
    assert {1, 2, 4, 8} <= counts  # the ends and midpoints of 1..8 instances
    assert all(sum(t for t, *_ in c) == 8 for c in configs if len(c) in (2, 4, 8))  # no idle core first


def test_select_rejects_infeasible_keep():
    with pytest.raises(ValueError):
        oracle_configs.select_configs(2, 4, keep=[((2, 2), (1, 2))])  # 3 threads on 2
    with pytest.raises(ValueError):
        oracle_configs.select_configs(2, 4, keep=[((1, 3),)])  # covers 3 of 4


def test_balanced_family():
    configs = oracle_configs.balanced_configs(64, 64)
    assert len(configs) == len(set(configs)) <= 6 * 64
    assert all(oracle_configs.feasible(c, 64, 64) for c in configs)
    assert ((64, 64),) in configs and ((1, 1),) * 64 in configs and ((16, 16),) * 4 in configs
    assert oracle_configs.arrange([(22, 22), (21, 21), (21, 21)]) in configs


def test_identical_family():
    assert oracle_configs.identical_configs(16, 32) == [((16, 32),), ((8, 16),) * 2, ((4, 8),) * 4, ((2, 4),) * 8,
                                                ((1, 2),) * 16]
    assert oracle_configs.identical_configs(12, 16) == [((12, 16),), ((6, 8),) * 2, ((3, 4),) * 4]
    assert oracle_configs.identical_configs(2, 1) == [((2, 1),)]
    planned = oracle_configs.canonical([(3, 4), (3, 4), (2, 4), (2, 2), (2, 2)])  # a planner's mixed choice
    configs, feasible = oracle_configs.select_configs(16, 16, keep=[((16, 16),), planned], family="identical")
    assert feasible is None  # the family counts nothing: no enumeration of 237,034 multisets
    assert set(configs) == {oracle_configs.canonical(c) for c in oracle_configs.identical_configs(16, 16)} | {planned}
    assert configs == sorted(configs, key=lambda c: oracle_configs.rank_key(c, 16, 16))
    default, _ = oracle_configs.select_configs(16, 16, keep=[planned])
    assert len(default) > 2 * len(configs)  # the default family is unchanged: balanced, up to the cap


def test_identical_family_is_stated():
    from packrat.cli.main import build_parser

    parser = build_parser()
    assert parser.parse_args(["bench", "oracle"]).family == "all"
    assert parser.parse_args(["bench", "oracle", "--family", "identical"]).family == "identical"
    report = oracle_report.build_report({**META, "family": "identical"}, [])
    assert "identical instances" in oracle_report.markdown(report)
    assert "identical" not in oracle_report.markdown(oracle_report.build_report(META, []))


def test_rank_key_prefers_no_idle_then_balance():
    key = lambda c: oracle_configs.rank_key(oracle_configs.canonical(c), 2, 8)
    assert key([(2, 8)]) < key([(1, 8)])  # an idle core ranks last
    assert key([(1, 4), (1, 4)]) < key([(1, 5), (1, 3)]) < key([(1, 7), (1, 1)])


def test_spread_order():
    assert oracle_configs.spread_order(0) == [] and oracle_configs.spread_order(1) == [0] and oracle_configs.spread_order(2) == [0, 1]
    order = oracle_configs.spread_order(10)
    assert sorted(order) == list(range(10)) and order[:3] == [0, 9, 4]


def test_label():
    assert oracle_configs.label(oracle_configs.canonical([(1, 4), (2, 8), (1, 4)])) == "⟨2,8⟩ + 2×⟨1,4⟩"
    mixed = oracle_configs.canonical([(1, 4, "onnxruntime"), (1, 4, "onnxruntime"), (2, 8, "inductor")])
    assert oracle_configs.label(mixed) == "⟨2,8⟩ + 2×⟨1,4,onnxruntime⟩"


def test_each_candidate_runs_under_each_runtime_and_each_runtime_has_its_fat(monkeypatch):
    configs, _ = oracle_configs.select_configs(2, 4, None, runtimes=("inductor", "openvino"))
    assert len(configs) == 2 * len(oracle_configs.all_configs(2, 4))
    assert all(len({r for *_, r in c}) == 1 for c in configs)  # every instance of a candidate: one runtime
    args = type("Args", (), {"runtimes": ("inductor", "onnxruntime"), "max_configs": 40, "family": "identical",
                             "batches": [4]})()
    profile = Profile(latency={})
    for t, b, runtime, ms in [(1, 2, "onnxruntime", 5.0), (1, 2, "inductor", 9.0), (2, 4, "inductor", 12.0),
                              (2, 4, "onnxruntime", 13.0)]:
        profile.add(runtime, t, b, ms, ms)
    (plan,) = oracle_configs.plan_batches(args, profile, Topology.virtual(2))
    assert plan["fat"] == ["⟨2,4⟩", "⟨2,4,onnxruntime⟩"]
    assert plan["planner"]["isolated"]["label"] == "2×⟨1,2,onnxruntime⟩"  # the plan runs its points' runtimes
    assert oracle_configs.canonical([(1, 2, "onnxruntime")] * 2) in plan["configs"]
    predicted = plan["predicted"]  # each configuration as the planned figures predict it
    assert predicted[oracle_configs.canonical([(2, 4, "onnxruntime")])] == 13.0
    assert predicted[oracle_configs.canonical([(1, 2, "onnxruntime")] * 2)] == 5.0
    assert oracle_configs.predicted_ms(oracle_configs.canonical([(1, 4)]), profile.points()) is None  # a point never measured
    e = entry(4, {"⟨2,4⟩": 12.0, "⟨2,4,onnxruntime⟩": 11.0, "2×⟨1,2,onnxruntime⟩": 10.0},
              ("2×⟨1,2,onnxruntime⟩", 10.0), ("2×⟨1,2,onnxruntime⟩", 10.0), plan["fat"])
    assert oracle_report.summarize_batch(e)["fat_vs_best"] == pytest.approx(1.1)  # the faster runtime's fat


# ---- estimates ----------------------------------------------------------------------------------

TABLE = {(1, 1): 10.0, (1, 2): 18.0, (1, 8): 70.0, (2, 1): 6.0, (2, 2): 10.0}


def test_estimate_ms():
    assert oracle_configs.estimate_ms(TABLE, 1, 2) == 18.0
    assert oracle_configs.estimate_ms(TABLE, 1, 5) == pytest.approx(18.0 + 0.5 * 52.0)  # between 2 and 8
    assert oracle_configs.estimate_ms(TABLE, 1, 16) == pytest.approx(140.0)  # past the largest: ∝ b
    assert oracle_configs.estimate_ms(TABLE, 2, 4) == pytest.approx(20.0)
    assert oracle_configs.estimate_ms(TABLE, 4, 2) == pytest.approx(10.0 * 2 / 4)  # nearest t, scaled


def test_run_time_estimate():
    loaded = {k: v * 1.2 for k, v in TABLE.items()}
    solo, pair = ((2, 2),), ((1, 1), (1, 1))
    assert oracle_configs.config_estimate_ms(solo, TABLE, loaded) == 10.0  # alone: isolated
    assert oracle_configs.config_estimate_ms(pair, TABLE, loaded) == pytest.approx(12.0)  # side by side: loaded
    assert oracle_configs.config_estimate_ms(pair, TABLE, None) == 10.0
    e = oracle_configs.batch_estimate_s([solo, pair], rounds=10, warmup=2, isolated=TABLE, loaded=loaded)
    assert e["timing_s"] == pytest.approx(12 * (0.010 + 0.012 + 2 * oracle_configs.CALL_OVERHEAD_S))
    warm = 2 * (10.0 + 6.0) / 1e3  # ⟨2,2⟩ warms up at 2 then 1, twice
    assert oracle_configs.start_estimate_s(solo, TABLE) == pytest.approx(oracle_configs.POOL_START_S + warm)


# ---- report and verdicts --------------------------------------------------------------------------

def entry(batch, medians, loaded, isolated, fat):
    """A time_batch result: medians {label: ms or None}, planner choices (label, predicted ms)."""
    configs = [{"label": name, "median_ms": ms, "samples_ms": [ms] if ms else [],
                "error": None if ms else "pool did not start"} for name, ms in medians.items()]
    planner = {kind: {"label": c[0], "predicted_ms": c[1]} for kind, c in (("loaded", loaded), ("isolated", isolated))}
    return {"batch": batch, "configs": configs, "planner": planner, "fat": fat}


META = {"model": "tiny", "threads": 2, "rounds": 3, "cpu": "test"}


def test_summary_and_passing_verdicts():
    e4 = entry(4, {"⟨2,4⟩": 100.0, "2×⟨1,2⟩": 80.0, "⟨1,4⟩": None}, ("2×⟨1,2⟩", 84.0), ("⟨2,4⟩", 60.0), "⟨2,4⟩")
    e1 = entry(1, {"⟨2,1⟩": 20.0, "⟨1,1⟩": 30.0}, ("⟨2,1⟩", 19.0), ("⟨2,1⟩", 19.0), "⟨2,1⟩")
    report = oracle_report.build_report(META, [e4, e1])
    s1, s4 = report["summaries"]
    assert (s1["batch"], s4["batch"]) == (1, 4)
    assert s4["best"] == "2×⟨1,2⟩" and s4["timed"] == 2 and s4["failed"] == 1
    assert s4["loaded"]["vs_best"] == 1.0 and s4["loaded"]["predicted_vs_measured"] == pytest.approx(1.05)
    assert s4["isolated"]["vs_best"] == pytest.approx(1.25)
    assert s4["isolated"]["predicted_vs_measured"] == pytest.approx(0.6)
    assert s4["fat_vs_best"] == pytest.approx(1.25)
    loaded = report["verdicts"]["loaded"]
    assert loaded[0].startswith("plan within 3 % of the oracle: PASS")
    assert loaded[1].startswith("prediction within 10 % of measured: PASS") and "1.050 at B=4" in loaded[1]
    isolated = report["verdicts"]["isolated"]
    assert "FAIL" in isolated[0] and "1.250 at B=4" in isolated[0] and "FAIL" in isolated[1]
    table = oracle_report.markdown(report)
    assert table.count("\n| ") == 3  # header and two batch rows
    assert "| 4 | 2 (+1 failed) | 2×⟨1,2⟩ | 80.0 | 2×⟨1,2⟩ | 1.00 | 1.05 | ⟨2,4⟩ | 1.25 | 0.60 | 1.25 |" in table


def test_verdict_fails_past_tolerance():
    e = entry(2, {"⟨2,2⟩": 100.0, "2×⟨1,1⟩": 96.0}, ("⟨2,2⟩", 111.0), ("⟨2,2⟩", 111.0), "⟨2,2⟩")
    lines = oracle_report.verdicts([oracle_report.summarize_batch(e)])
    assert "FAIL" in lines[0] and "1.042 at B=2" in lines[0]  # 100/96 > 1.03
    assert "FAIL" in lines[1]  # 111/100 off by 11 %


def test_verdict_without_figures():
    e = entry(2, {"⟨2,2⟩": 100.0}, (None, None), ("⟨2,2⟩", 100.0), "⟨2,2⟩")
    e["planner"]["loaded"] = {"label": None, "why": "no loaded figures"}
    s = oracle_report.summarize_batch(e)
    assert s["loaded"]["label"] is None
    assert all("n/a" in line for line in oracle_report.verdicts([s], "loaded"))
    assert all("PASS" in line for line in oracle_report.verdicts([s], "isolated"))
    failed = entry(2, {"⟨2,2⟩": 100.0, "2×⟨1,1⟩": None}, ("2×⟨1,1⟩", 90.0), ("⟨2,2⟩", 100.0), "⟨2,2⟩")
    s = oracle_report.summarize_batch(failed)
    assert s["loaded"]["why"] == "its pool failed"
    assert oracle_report.verdicts([s])[0].startswith("plan within 3 % of the oracle: FAIL (loaded profile: not measured at B=2)")


def test_a_b_where_no_pool_could_be_timed_fails_every_verdict():
    good = oracle_report.summarize_batch(entry(2, {"⟨2,2⟩": 100.0}, ("⟨2,2⟩", 100.0), ("⟨2,2⟩", 100.0), "⟨2,2⟩"))
    lost = oracle_report.summarize_batch(entry(4, {"⟨2,4⟩": None}, ("⟨2,4⟩", 200.0), ("⟨2,4⟩", 200.0), "⟨2,4⟩"))
    assert "best_ms" not in lost
    assert all(line.endswith(": FAIL (loaded profile: not measured at B=4)") for line in oracle_report.verdicts([good, lost]))
    assert all("PASS" in line for line in oracle_report.verdicts([good]))


def test_merge(tmp_path):
    import json

    a = oracle_report.build_report(META, [entry(1, {"⟨2,1⟩": 20.0}, ("⟨2,1⟩", 20.0), ("⟨2,1⟩", 20.0), "⟨2,1⟩")])
    b = oracle_report.build_report(META, [entry(4, {"⟨2,4⟩": 50.0}, ("⟨2,4⟩", 50.0), ("⟨2,4⟩", 50.0), "⟨2,4⟩")])
    (tmp_path / "a.json").write_text(json.dumps(a))
    (tmp_path / "b.json").write_text(json.dumps(b))
    merged = oracle_report.merge([tmp_path / "b.json", tmp_path / "a.json"])
    assert [s["batch"] for s in merged["summaries"]] == [1, 4]
    other = oracle_report.build_report({**META, "threads": 4}, [])
    (tmp_path / "c.json").write_text(json.dumps(other))
    with pytest.raises(ValueError):
        oracle_report.merge([tmp_path / "a.json", tmp_path / "c.json"])


def test_help_states_the_bound(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "oracle", "--help"])
    text = capsys.readouterr().out
    assert "--max-configs" in text and "50,000" in text and "balanced family" in text


def test_trim_hint():
    plans = [{"batch": 8}, {"batch": 16}]
    small = [{"start_s": 10.0, "timing_s": 30.0}, {"start_s": 20.0, "timing_s": 60.0}]
    assert oracle_configs.trim_hint(plans, small, rounds=10, warmup=2) is None
    big = [{"start_s": 60.0, "timing_s": 240.0}, {"start_s": 120.0, "timing_s": 480.0}]  # 60 s per round
    hint = oracle_configs.trim_hint(plans, big, rounds=10, warmup=2)
    assert "--rounds 5 would fit" in hint and "B=16 10.0 min" in hint  # (600 − 180) / 60 − 2
    assert "no number of rounds" in oracle_configs.trim_hint(plans, [{"start_s": 700.0, "timing_s": 10.0}] * 2, 10, 1)


# ---- pools in groups that fit memory ----------------------------------------------------------------

def test_anchors_are_the_plans_then_each_runtimes_fat():
    fat_i, fat_o = ((2, 4, "inductor"),), ((2, 4, "onnxruntime"),)
    split = ((1, 2, "onnxruntime"),) * 2
    other = ((1, 3, "inductor"), (1, 1, "inductor"))
    plan = {"planner": {"loaded": {"label": oracle_configs.label(split)}, "isolated": {"label": oracle_configs.label(fat_o)}},
            "fat": [oracle_configs.label(fat_i), oracle_configs.label(fat_o)]}
    anchors, rest = oracle.anchored([fat_i, other, fat_o, split], plan)
    assert anchors == [split, fat_o, fat_i] and rest == [other]


def test_rescaled_keeps_each_ratio_to_the_reference_as_measured_side_by_side():
    plan, a, b = "plan", "a", "b"
    # the machine ran 20 % slower during group 1: the plan took 100 then 120
    samples = {plan: [(100.0, 0)] * 3 + [(120.0, 1)] * 3, a: [(90.0, 0)] * 3, b: [(114.0, 1)] * 3}
    medians = oracle.rescaled(samples, plan)
    plan_ms = medians[plan]
    assert medians[a] / plan_ms == pytest.approx(0.9) and medians[b] / plan_ms == pytest.approx(0.95)
    assert min(medians, key=medians.get) == a  # raw medians would rank them the same only by chance
    one_group = {plan: [(100.0, 0), (102.0, 0)], a: [(90.0, 0)]}
    assert oracle.rescaled(one_group, plan) == {plan: 101.0, a: 90.0}
    assert oracle.rescaled(one_group, None) == {plan: 101.0, a: 90.0}


PROFILE_HEAD = ("# model: tiny\n# mode: eager\n# latency: loaded\n# cores: 2\n# runtimes: inductor\n"
                "threads,batch,latency_ms,isolated_ms,copies,runtime\n")


@pytest.mark.slow
def test_pools_that_do_not_fit_at_once_are_timed_in_groups_beside_the_plan(tmp_path, capsys):
    profile = tmp_path / "tiny.csv"
    rows = [f"{t},{b},{1.0 * b / t:.3f},{1.0 * b / t:.3f},{3 - t},inductor" for t in (1, 2) for b in (1, 2)]
    profile.write_text(PROFILE_HEAD + "\n".join(rows) + "\n")
    out = tmp_path / "oracle.json"
    assert main(["bench", "oracle", "--model", "tiny", "--batches", "2", "--threads", "2", "--rounds", "2", "--profile",
                        str(profile), "--memory-mib", "1", "--json", str(out), "--quiet"]) == 0
    import json

    entry = json.loads(out.read_text())["batches"][0]
    configs = {c["label"]: c for c in entry["configs"]}
    anchors = [c for c in configs.values() if c["group"] is None]
    assert entry["groups"] == len(configs) - len(anchors) >= 2  # one configuration a group at 1 MiB
    assert all(len(c["samples_ms"]) == 2 * entry["groups"] for c in anchors)  # timed in every group
    assert all(c["median_ms"] is not None and c["error"] is None for c in configs.values())
    assert all(len(c["sample_rounds"]) == len(c["samples_ms"]) for c in configs.values())  # each sample's round


# ---- a profile too sparse to plan with, and the rounds paired ------------------------------------

def _sparse_args(batches):
    return type("Args", (), {"runtimes": ("inductor",), "max_configs": 4, "family": "all", "batches": batches})()


def test_a_sparse_profile_whose_points_make_b_is_planned_and_one_that_cannot_is_refused_in_words():
    profile = Profile(latency={}, metadata={"latency": "loaded"})
    profile.add("inductor", 1, 1, 10.0, None)  # one point, loaded only: what a short search leaves
    plans = oracle_configs.plan_batches(_sparse_args([2, 3]), profile, Topology.virtual(2))
    assert plans[0]["planner"]["loaded"]["label"] == "2×⟨1,1⟩"
    reasons = oracle_configs.too_sparse(plans, profile, 2)
    assert list(reasons) == [3]  # 2×⟨1,1⟩ makes B = 2 on 2 cores; nothing makes 3
    assert reasons[3] == ("its points ⟨threads, batch⟩ (⟨1,1⟩) cannot make batch 3 on 2 cores: no set of them "
                          "has Σ threads ≤ 2 and Σ batch = 3")
    nothing = oracle_configs.plan_batches(_sparse_args([2]), None, Topology.virtual(2))
    assert oracle_configs.too_sparse(nothing, None, 2) == {2: "it has no points"}


def test_the_oracle_refuses_a_header_only_profile_and_estimates_a_loaded_only_one(tmp_path, capsys):
    empty = tmp_path / "empty.csv"
    empty.write_text(PROFILE_HEAD)
    assert main(["bench", "oracle", "--model", "tiny", "--batches", "1,2", "--threads", "1", "--profile", str(empty),
                 "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert f"{empty} is too sparse to plan with:\n  B=1: it has no points\n  B=2: it has no points\n" in err
    assert f"packrat profile --model tiny --threads 1-1 --batches 1,2 --out {empty}" in err
    loaded = tmp_path / "loaded.csv"  # ⟨1,1⟩ measured beside copies only: no isolated figure
    loaded.write_text(PROFILE_HEAD + "1,1,5.0,,2,inductor\n")
    assert main(["bench", "oracle", "--model", "tiny", "--batches", "1", "--threads", "1", "--profile", str(loaded),
                 "--dry-run"]) == 0
    assert "estimated run time" in capsys.readouterr().out  # once "empty profile table"


def test_the_plan_over_the_best_is_paired_round_by_round_within_each_group():
    # the plan spans both groups; the best ran in group 1 only, while the machine was slower
    plan = {"label": "⟨2,2⟩", "median_ms": 110.0, "samples_ms": [100.0, 100.0, 120.0, 124.0],
            "sample_rounds": [[0, 1], [0, 2], [1, 1], [1, 2]]}
    best = {"label": "2×⟨1,1⟩", "median_ms": 100.0, "samples_ms": [118.0, 120.0], "sample_rounds": [[1, 1], [1, 2]]}
    e = {"batch": 2, "configs": [plan, best], "fat": ["⟨2,2⟩"],
         "planner": {"loaded": {"label": "⟨2,2⟩", "predicted_ms": 100.0}, "isolated": None}}
    loaded = oracle_report.summarize_batch(e)["loaded"]
    assert loaded["vs_best"] == pytest.approx((120 / 118 + 124 / 120) / 2)  # not 100 / 118 by position
    assert loaded["vs_best_spread"] == pytest.approx([120 / 118, 124 / 120])
    line = oracle_report.verdicts([oracle_report.summarize_batch(e)])[0]
    assert line.startswith("plan within 3 % of the oracle: PASS") and "worst 1.025 (rounds 1.017–1.033) at B=2" in line
    assert "| 1.03 (1.02–1.03) |" in oracle_report.markdown(oracle_report.build_report(META, [e]))
