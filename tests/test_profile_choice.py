"""Which of an archive's profiles a server plans with: same CPU model first, then core counts."""

from __future__ import annotations

from pathlib import Path

import pytest

from packrat.profiling.profiles import choose, load

XEON, EPYC = "Intel(R) Xeon(R) Gold 6142 CPU @ 2.60GHz", "AMD EPYC 7763 64-Core Processor"
SHARED = Path(__file__).resolve().parents[2] / "shared" / "reference-profiles"


def meta(cpu: str | None, cores: int | None) -> dict:
    return {k: v for k, v in (("cpu", cpu), ("cores", None if cores is None else str(cores))) if v is not None}


@pytest.mark.parametrize("profiles,cpu,cores,expected,rule", [
    # same CPU with enough cores: the fewest such
    ([meta(XEON, 32), meta(XEON, 8), meta(XEON, 16), meta(EPYC, 8)], XEON, 8, 1, "fewest cores"),
    ([meta(XEON, 32), meta(XEON, 4), meta(XEON, 16)], XEON, 12, 2, "fewest cores"),
    # same CPU, none with enough: the most cores
    ([meta(XEON, 4), meta(XEON, 8), meta(EPYC, 64)], XEON, 16, 1, "most cores"),
    # another CPU: the nearest core count, ties to the larger
    ([meta(EPYC, 4), meta(EPYC, 32), meta(XEON, 12)], "ARM Neoverse-N1", 10, 2, "nearest core count"),
    ([meta(EPYC, 4), meta(EPYC, 8)], "ARM Neoverse-N1", 6, 1, "nearest core count"),
    # no metadata: unknown CPU; unknown cores lose to known ones
    ([meta(None, None), meta(None, 16)], XEON, 2, 1, "nearest core count"),
    ([meta(None, None), meta(None, None)], None, 2, 0, "nearest core count"),
    ([meta(EPYC, 2)], XEON, 16, 0, "the only profile"),
])
def test_choose(profiles, cpu, cores, expected, rule):
    index, why = choose(profiles, cpu, cores)
    assert index == expected and rule in why


def test_the_reason_names_cpu_models_and_core_counts():
    index, why = choose([meta(EPYC, 64), meta(XEON, 16)], XEON, 4)
    assert index == 1
    assert why == (f"taken on {XEON}, 16 cores; this machine: {XEON}, 4 cores budgeted; "
                   "same CPU, the fewest cores of those with enough")
    assert "taken on unknown CPU, ? cores; this machine: unknown CPU, 2 cores" in choose([{}], None, 2)[1]


def test_no_profile_is_an_error():
    with pytest.raises(ValueError, match="no profile"):
        choose([], XEON, 2)


def test_reference_profiles_without_metadata_count_as_an_unknown_cpu():
    paths = [SHARED / "resnet_large-batches.csv", SHARED / "bert_large-batches.csv"]
    if not all(p.exists() for p in paths):
        pytest.skip(f"no reference profiles in {SHARED}")
    measured = {"cpu": XEON, "cores": "2", "mode": "compile"}
    index, why = choose([load(paths[0]).metadata, measured, load(paths[1]).metadata], XEON, 2)
    assert index == 1 and "same CPU" in why
    index, why = choose([load(paths[0]).metadata, measured], EPYC, 16)
    assert index == 1 and "nearest core count" in why  # the published profile's cores are unknown: 2 are known
    index, why = choose([load(paths[0]).metadata, load(paths[1]).metadata], EPYC, 16)
    assert index == 0 and why.startswith("taken on unknown CPU, ? cores; this machine: AMD EPYC")
