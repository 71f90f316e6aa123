"""Near-ties settled before serving, the pure part: which plans the profile cannot tell apart at a
batch (candidates), and which of them paired rounds of timings say is faster (verdict). Plain
numbers in, plain data out; the timing through pools is serving/settling.py's.

Why: a profile measures each runtime's points in workers of their own, minutes apart; the machine
drifts between them by more than a point's own spread holds. On the 2-core VM the default ResNet-50
profile put OpenVINO ahead of ONNX Runtime at ⟨2, 1⟩, and packrat's OpenVINO instance served
30.4 ms against one ONNX Runtime session's 27.6 (2026-12-01). Timed side by side, in the same
minute, the same noise hits both.

The candidates at batch B on T threads: the profile's plan (each point's runtime as the profile
chose it), and each measured runtime's own best plan, its fat instance ⟨T, B⟩ (estimated where
the profile skipped it: fat_estimates), and the best plan without the slowest point of the
profile's plan and of each runtime's best (other shapes). Those
expected within the noise of the fastest of them (near_tie) are kept, the profile's plan first, the
rest fastest first, MAX_CANDIDATES at most.

The verdict (paired rounds: each round times every candidate once, side by side): the profile's
plan stands unless a challenger is faster in so many rounds that a coin would show as many heads
less often than SIGNIFICANCE (a one-sided sign test, SIGNIFICANCE shared out over the challengers)
and by MIN_LEAD at least (median of its paired ratios). A challenger that wins becomes the one to
beat, and so on. Rounds end early once no challenger can still win in the rounds left, or at
max_rounds: a challenger that has not won by then is level, and level never displaces the profile's
plan (no winner on a coin toss).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from packrat.errors import NoPlanError
from packrat.machine.topology import Topology
from packrat.planning.planner import Plan, Planner
from packrat.settings import RUNTIME_MARGIN

Key = tuple[int, int, str]  # (threads, batch, runtime)
# A point's figure and its noise as planned with: (ms, spread ms: mad_ms, or std_ms in older profiles)
Figure = tuple[float, float]

# Two figures measured minutes apart differ by each one's own noise (their spreads, added: both may
# be off) and by the drift between them, which neither spread holds. Its floor is the lead the profile
# itself trusts to pick a runtime (RUNTIME_MARGIN, as the search trusts 2 %): a lead beyond it was
# still seen reversed (above), so leads up to spreads + floor are settled by timing, not by the profile.
TIE_FLOOR = RUNTIME_MARGIN
# ... and at most this: a plan expected 25 % slower is no near-tie whatever the spreads. Settling
# costs seconds before serving, so its cap is wider than the online trials' (serving/trials.py): the
# largest reversal measured here was 25 % (SqueezeNet at ⟨2, 1⟩, 2026-12-02: ONNX Runtime's point
# 5.49 ms against OpenVINO's 4.72, while one session of each served 4.39 and 5.52 beside each other).
MAX_TIE = 0.25
MAX_CANDIDATES = 4  # plans timed at one batch, at most: the cost is rounds × candidates × a batch
SIGNIFICANCE = 0.05  # a challenger's wins must be this unlikely on a coin, shared over the challengers
# A lead below this is level: the peers' target allows 2 % (bench/peers.PEER_TARGET), and a winner by
# less would not be worth the pools' start-up the settling costs.
MIN_LEAD = 0.01
# A fat instance the profile did not measure is estimated on the line through two batches it measured
# on as many threads; the bend of the true curve between them is noise of the estimate's own, this
# share of its figure, added to theirs: it makes the estimate a near-tie to time, never a plan served
# untimed.
ESTIMATE_NOISE = 0.05


@dataclass(frozen=True)
class Candidate:
    plan: Plan
    why: str  # what it is: "the profile's plan", "onnxruntime's best", "openvino's fat instance", ...
    expected_ms: float  # its slowest instance's figure
    spread_ms: float  # that instance's noise

    @property
    def label(self) -> str:
        return self.plan.describe()


def near_tie(best_ms: float, best_spread_ms: float, other_ms: float, other_spread_ms: float) -> bool:
    """Whether a plan expected to take `other_ms` cannot be told by the profile from the fastest
    candidate's `best_ms`: slower by no more than the two spreads added and TIE_FLOOR of best_ms,
    and by no more than MAX_TIE of it."""
    band = min(MAX_TIE * best_ms, best_spread_ms + other_spread_ms + TIE_FLOOR * best_ms)
    return other_ms - best_ms <= band


def candidates(points: Mapping[Key, Figure], runtimes: Mapping[tuple[int, int], str], threads: int, batch: int,
               topology: Topology | None = None, fat_only: bool = False,
               limit: int = MAX_CANDIDATES) -> list[Candidate]:
    """The plans to time side by side at `batch` on `threads` (first: the profile's plan, the one
    `runtimes` gives: each ⟨t, b⟩'s chosen runtime), near-ties of the fastest of them only; one (the
    profile's plan) where nothing ties, none where the profile cannot plan the batch. `fat_only`:
    plans of one instance with every thread only (the archive's plan "fat"). Each runtime's fat
    instance is one, measured or, where the profile skipped it, estimated (fat_estimates): one
    session of a runtime on every core is what packrat must never be behind."""
    chosen = {(t, b): r for (t, b), r in runtimes.items() if (t, b, r) in points}
    estimated = fat_estimates(points, threads, batch)
    figures = {**estimated, **points}
    found: dict[tuple, Candidate] = {}

    def add(plan: Plan | None, why: str) -> None:
        if plan is not None and signature(plan) not in found:
            found[signature(plan)] = candidate(plan, why, figures)

    add(best_plan(points, chosen, threads, batch, topology, fat_only), "the profile's plan")
    if not found:
        return []
    profile_plan = next(iter(found.values())).plan
    if not fat_only:
        add(best_plan(points, without_slowest(chosen, profile_plan, points), threads, batch, topology),
            "other shapes")
    for runtime in sorted({r for _, _, r in points}):
        own = {(t, b): runtime for t, b, r in points if r == runtime}
        best = best_plan(points, own, threads, batch, topology, fat_only)
        add(best, f"{runtime}'s best")
        fat = (threads, batch, runtime)
        add(best_plan(figures, {**own, fat[:2]: runtime} if fat in estimated else own, threads, batch, topology, True),
            f"{runtime}'s fat instance{', estimated' if fat in estimated else ''}")
        if best is not None and not fat_only:
            add(best_plan(points, without_slowest(own, best, points), threads, batch, topology),
                f"{runtime}'s other shapes")
    first, *rest = found.values()
    fastest = min(found.values(), key=lambda c: c.expected_ms)
    tied = [c for c in sorted(rest, key=lambda c: c.expected_ms)
            if near_tie(fastest.expected_ms, fastest.spread_ms, c.expected_ms, c.spread_ms)]
    return [first, *tied][:limit]


def fat_estimates(points: Mapping[Key, Figure], threads: int, batch: int) -> dict[Key, Figure]:
    """Each runtime's fat instance ⟨threads, batch⟩ that `points` lack, where they hold two other
    batches on `threads`: on the line through the measured batches either side of `batch` (or the
    two largest below it), no faster than a smaller batch measured, its noise theirs plus ESTIMATE_NOISE."""
    found: dict[Key, Figure] = {}
    for runtime in sorted({r for _, _, r in points}):
        if (threads, batch, runtime) in points:
            continue
        line = sorted((b, points[t, b, r]) for t, b, r in points if t == threads and r == runtime)
        below, above = [p for p in line if p[0] < batch], [p for p in line if p[0] > batch]
        ends = [below[-1], above[0]] if below and above else below[-2:]
        if len(ends) < 2:
            continue
        (b1, (ms1, spread1)), (b2, (ms2, spread2)) = ends
        ms = max(ms1 + (ms2 - ms1) * (batch - b1) / (b2 - b1), *(figure[0] for _, figure in below))
        found[threads, batch, runtime] = (ms, max(spread1, spread2) + ESTIMATE_NOISE * ms)
    return found


def held(points: Mapping[Key, object], key: Key) -> bool:
    """Whether `points` hold `key` ((threads, batch, runtime)), or can estimate it as a fat instance
    (fat_estimates: its runtime measured at two other batches on as many threads)."""
    threads, _, runtime = key
    return key in points or sum(1 for t, _, r in points if t == threads and r == runtime) >= 2


def signature(plan: Plan) -> tuple:
    """A plan's instances as a multiset: two plans of it are one candidate."""
    return tuple(sorted((i.threads, i.batch, i.runtime) for i in plan.instances))


def candidate(plan: Plan, why: str, points: Mapping[Key, Figure]) -> Candidate:
    slowest = max(plan.instances, key=lambda i: points[i.threads, i.batch, i.runtime][0])
    ms, spread = points[slowest.threads, slowest.batch, slowest.runtime]
    return Candidate(plan, why, ms, spread)


def best_plan(points: Mapping[Key, Figure], runtimes: Mapping[tuple[int, int], str], threads: int, batch: int,
              topology: Topology | None, fat_only: bool = False) -> Plan | None:
    """The best plan on the points `runtimes` names (⟨t, b⟩ -> its runtime), None where they cannot
    plan the batch; with `fat_only`, their fat instance ⟨threads, batch⟩ or None."""
    items = [(t, b, points[t, b, r][0]) for (t, b), r in runtimes.items()]
    if fat_only:
        items = [item for item in items if item[:2] == (threads, batch)]
    if not items:
        return None
    try:
        return Planner(items, threads, batch, dict(runtimes)).plan(threads, batch, topology)
    except (NoPlanError, ValueError):
        return None


def without_slowest(runtimes: Mapping[tuple[int, int], str], plan: Plan,
                    points: Mapping[Key, Figure]) -> dict[tuple[int, int], str]:
    """`runtimes` without the ⟨t, b⟩ of `plan`'s slowest instance: the best plan of other shapes."""
    slowest = max(plan.instances, key=lambda i: points[i.threads, i.batch, i.runtime][0])
    return {point: r for point, r in runtimes.items() if point != (slowest.threads, slowest.batch)}


# ---- the verdict from paired rounds ------------------------------------------------------------------

@dataclass(frozen=True)
class Verdict:
    winner: str  # the label of the plan to serve
    done: bool  # no challenger can still win in the rounds left (or none are left)
    rounds: int  # rounds timed
    medians_ms: dict[str, float]  # each candidate's median over the rounds it was timed in
    open: tuple[str, ...] = ()  # challengers still able to win: the ones worth timing in the next round
    others: dict[str, dict] = field(default_factory=dict)  # each other candidate against the winner:
    # {"ratio": median of its paired ratios (above 1: slower), "faster_in": rounds it was faster, "of": rounds}


def tail_probability(wins: int, rounds: int) -> float:
    """P(at least `wins` heads in `rounds` fair coin tosses): how often chance alone wins as often."""
    return sum(math.comb(rounds, k) for k in range(wins, rounds + 1)) / 2 ** rounds


def paired_ratios(rounds: Sequence[Mapping[str, float]], challenger: str, incumbent: str) -> list[float]:
    """challenger / incumbent in every round that timed both."""
    return [r[challenger] / r[incumbent] for r in rounds if challenger in r and incumbent in r and r[incumbent] > 0]


def verdict(rounds: Sequence[Mapping[str, float]], labels: Sequence[str], max_rounds: int,
            significance: float = SIGNIFICANCE, min_lead: float = MIN_LEAD) -> Verdict:
    """Which of `labels` (the profile's plan first) to serve after `rounds` (each: label -> that
    round's ms, for the candidates timed in it), when at most `max_rounds` will be timed."""
    alpha = significance / max(1, len(labels) - 1)  # shared over the challengers: no winner by multiplicity
    incumbent, left = labels[0], max(0, max_rounds - len(rounds))

    def wins(challenger: str, against: str) -> bool:
        ratios = paired_ratios(rounds, challenger, against)
        faster = sum(r < 1 for r in ratios)
        return bool(ratios) and tail_probability(faster, len(ratios)) <= alpha and \
            statistics.median(ratios) <= 1 - min_lead

    for _ in labels:  # each step beats the one before: at most one step per candidate
        winners = [c for c in labels if c != incumbent and wins(c, incumbent)]
        if not winners:
            break
        incumbent = min(winners, key=lambda c: statistics.median(paired_ratios(rounds, c, incumbent)))

    def may_still_win(challenger: str) -> bool:
        ratios = paired_ratios(rounds, challenger, incumbent)
        faster = sum(r < 1 for r in ratios)
        return left > 0 and tail_probability(faster + left, len(ratios) + left) <= alpha

    others = [c for c in labels if c != incumbent]
    still = tuple(c for c in others if may_still_win(c))
    medians = {c: statistics.median(ms) for c in labels if (ms := [r[c] for r in rounds if c in r])}
    against = {}
    for c in others:
        ratios = paired_ratios(rounds, c, incumbent)
        if ratios:
            against[c] = {"ratio": statistics.median(ratios), "faster_in": sum(r < 1 for r in ratios),
                          "of": len(ratios)}
    return Verdict(incumbent, not still, len(rounds), medians, still, against)


def rounds_to_decide(candidates_count: int, significance: float = SIGNIFICANCE) -> int:
    """The fewest rounds in which a challenger faster in every one can win: fewer decide nothing."""
    alpha = significance / max(1, candidates_count - 1)
    return max(1, math.ceil(math.log2(1 / alpha)))


def round_order(labels: Sequence[str], round_index: int) -> list[str]:
    """The order of round `round_index` (from 0): as listed, then reversed, and so on, so that over
    two rounds every candidate runs after each other one as often as before it."""
    return list(labels) if round_index % 2 == 0 else list(reversed(labels))
