"""What the plan predicted against what its instances serve, and the profile corrected by it.
Pure: numbers in, numbers out (the engine feeds it the pool's timings and acts on its verdicts).

Every answered sub-batch that ran its instance's whole planned batch gives one sample of the
instance's model stage (the run alone, stamped inside the instance: the figure a profile point
measures) under its key ⟨threads, batch, runtime⟩. A key's served figure is the median of its last
WINDOW samples, once it has MIN_SAMPLES; samples taken while the pool settles (a reconfiguration,
an instance killed and respawned) are left out: its first batches, and its neighbours', run slow.

A served figure corrects the profile's when they disagree beyond the noise: by more than
CORRECTION_MARGIN and by more than twice the median's own uncertainty (from the samples' spread).
A correction then stands for the point on this machine (the engine keeps it beside the profile, so
a restart starts from it) until a later served figure disagrees with it by more than
RECORRECTION_MARGIN. The engine plans with the corrected figures and switches only when the new
plan is better by SWITCH_MARGIN, on the corrected figures of both, and COOLDOWN_S after its last
switch on served figures; the comparison is made again at every look, so a better plan found
inside the cool-down is switched to when it ends (SwitchPolicy). The margins and the cool-down are there because this VM drifts: one run
served the same ⟨1 thread, batch 1⟩ point in 10.6, 14.0 and 15.3 ms a minute apart, and with a 5 %
margin alone the plan went round four plans ten times in 150 s (BENCHMARKS.md, issue 32).

A figure corrected upwards is never served again (the plans avoid it); so that a slow patch (a
noisy neighbour) does not bar a point forever, a correction expires after MAX_AGE_S, and all of
them when the profile is taken again (their file names the profile's date).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import asdict, dataclass

from packrat.models.runtimes import runtime_of

WINDOW = 50  # samples per key the served figure is the median of
MIN_SAMPLES = 20  # ... and it needs at least this many
CORRECTION_MARGIN = 0.05  # a served figure corrects the profile's beyond this relative difference ...
NOISE_FACTOR = 2.0  # ... and beyond this many times the median's standard error
RECORRECTION_MARGIN = 0.15  # a corrected figure is corrected again only beyond this (the machine drifts)
SWITCH_MARGIN = 0.05  # a corrected plan replaces the served one only when faster by this much ...
COOLDOWN_S = 60.0  # ... and this long after the last switch made on served figures
MAX_AGE_S = 24 * 3600.0  # a correction older than this is dropped: the point gets another chance

Key = tuple[int, int, str]  # (threads, batch, runtime)


def served_key(threads: int, batch: int, mode: str) -> Key:
    """The key of an instance of `threads` and planned `batch` that runs in `mode` (a graph mode, or
    the runtime it runs: an instance that fell back runs another runtime than planned)."""
    return threads, batch, runtime_of(mode)


@dataclass(frozen=True)
class Correction:
    threads: int
    batch: int
    runtime: str
    profile_ms: float  # the profile's figure
    served_ms: float  # what the instances served: the figure planned with from now on
    samples: int
    at: float  # unix time it was made

    @property
    def key(self) -> Key:
        return self.threads, self.batch, self.runtime

    def to_json(self) -> dict:
        return asdict(self)


class ServedLatencies:
    """The last WINDOW samples per key of two figures: the model stage (what a profile point
    measures, which corrections compare with it) and the round (from the sub-batch's dispatch to its
    answers handed out: the model with the whole path around its kind of instance, as a trial weighs
    two plans). Not thread-safe: the pool adds and the engine reads under the pool's lock."""

    def __init__(self, window: int = WINDOW):
        self._window = window
        self._samples: dict[Key, deque[float]] = {}
        self._rounds: dict[Key, deque[float]] = {}
        self._settling_until = 0.0

    def add(self, key: Key, model_ms: float, requests: int, now: float, round_ms: float | None = None) -> None:
        """One answered sub-batch: kept when it ran the key's whole batch and the pool is not settling."""
        if requests != key[1] or now < self._settling_until or not model_ms > 0:
            return
        self._samples.setdefault(key, deque(maxlen=self._window)).append(model_ms)
        if round_ms is not None:
            self._rounds.setdefault(key, deque(maxlen=self._window)).append(round_ms)

    def settle(self, until: float) -> None:
        """Leave out what is served until then, and forget what was gathered (a switch, a fault)."""
        self._settling_until = max(self._settling_until, until)
        self._samples.clear()
        self._rounds.clear()

    def figures(self, min_samples: int = MIN_SAMPLES, rounds: bool = False) -> dict[Key, tuple[float, float, int]]:
        """Each key with enough samples: (median ms, its standard error in ms, samples), of the
        model stage or (`rounds`) of the round."""
        found = {}
        for key, samples in (self._rounds if rounds else self._samples).items():
            if len(samples) >= min_samples:
                found[key] = (statistics.median(samples), median_error(samples), len(samples))
        return found


def median_error(samples) -> float:
    """The standard error of the median of `samples`, from their median absolute deviation (robust
    to the odd slow batch): 1.253 σ / √n with σ = 1.4826 MAD."""
    middle = statistics.median(samples)
    mad = statistics.median(abs(x - middle) for x in samples)
    return 1.253 * 1.4826 * mad / math.sqrt(len(samples))


def disagrees(planned_ms: float, served_ms: float, error_ms: float, margin: float = CORRECTION_MARGIN) -> bool:
    """Whether a served figure differs from the one planned with beyond the noise."""
    gap = abs(served_ms - planned_ms)
    return gap > margin * planned_ms and gap > NOISE_FACTOR * error_ms


def corrections_from(served: dict[Key, tuple[float, float, int]], profile_ms: dict[Key, float],
                     current: dict[Key, Correction], now: float, max_age_s: float = MAX_AGE_S
                     ) -> dict[Key, Correction]:
    """The corrections to plan with: `current` ones younger than max_age_s, replaced or joined by a
    new one for every served key whose figure disagrees with the one planned with (the current
    correction's, else the profile's). Keys the profile lacks are left alone."""
    kept = {key: c for key, c in current.items() if now - c.at <= max_age_s and key in profile_ms}
    for key, (median, error, samples) in served.items():
        if key not in profile_ms:
            continue
        planned = kept[key].served_ms if key in kept else profile_ms[key]
        if disagrees(planned, median, error, RECORRECTION_MARGIN if key in kept else CORRECTION_MARGIN):
            kept[key] = Correction(*key, profile_ms[key], median, samples, now)
    return kept


@dataclass
class HeldBack:
    """A better plan the cool-down holds back: switched to once the cool-down ends."""
    plan: str  # its description
    current_ms: float  # the served plan's figure, corrected
    proposed_ms: float  # the held plan's
    until: float  # the clock's time the cool-down ends


class SwitchPolicy:
    """When the plan on the corrected figures replaces the one served. The decision is taken again
    at every look (decide()), not only when a correction arrives: a better plan that a correction
    found inside the cool-down is held back, and switched to when the cool-down ends, unless later
    figures made it no better. (Deciding only on new corrections left ResNet-50 on one core of two
    for good: the second correction landed 10 s into the 60 s cool-down; BENCHMARKS.md, issue 42.)
    `clock`: monotonic seconds; tests drive it."""

    def __init__(self, margin: float = SWITCH_MARGIN, cooldown_s: float = COOLDOWN_S, clock=None):
        import time

        self.margin, self.cooldown_s, self.clock = margin, cooldown_s, clock or time.monotonic
        self.last_switch: float | None = None  # the last switch made on served figures
        self.held: HeldBack | None = None

    def decide(self, current: str, current_ms: float, proposed: str, proposed_ms: float) -> str:
        """"switch", "hold" (better, but inside the cool-down: `held` says until when) or "keep",
        for the served plan `current` against `proposed`, both on the corrected figures."""
        if proposed == current or not proposed_ms < current_ms * (1 - self.margin):
            self.held = None
            return "keep"
        now = self.clock()
        if self.last_switch is not None and now - self.last_switch < self.cooldown_s:
            self.held = HeldBack(proposed, current_ms, proposed_ms, self.last_switch + self.cooldown_s)
            return "hold"
        self.held = None
        return "switch"

    def calm(self) -> bool:
        """Whether the cool-down is over and no switch is held back."""
        return self.held is None and (self.last_switch is None or self.clock() - self.last_switch >= self.cooldown_s)

    def switched(self) -> None:
        """A switch the last "switch" asked for is under way: the cool-down starts."""
        self.last_switch, self.held = self.clock(), None

    def status(self) -> dict | None:
        """The plan held back and how long until the cool-down ends, or None."""
        if self.held is None:
            return None
        return {"plan": self.held.plan, "current_ms": self.held.current_ms, "proposed_ms": self.held.proposed_ms,
                "cooldown_left_s": max(0.0, self.held.until - self.clock())}


# ---- corrections carried to the points that share their cause ------------------------------------

SIBLING_SHARE = 0.5  # the other runtimes of a corrected ⟨t, b⟩: half its log-ratio
NEIGHBOUR_SHARE = 0.5  # the batches next to it (b / 2, 2b) of the same threads and runtime: half its log-ratio


@dataclass(frozen=True)
class Inferred:
    """A figure not served but inferred from a correction of a point that shares its cause."""
    threads: int
    batch: int
    runtime: str
    profile_ms: float
    inferred_ms: float
    rule: str  # "runtimes of a served point" or "batches next to a served point"
    source: str  # the served point(s) it comes from

    @property
    def key(self) -> Key:
        return self.threads, self.batch, self.runtime

    def to_json(self) -> dict:
        return asdict(self)


def inferred_from(corrections: dict[Key, Correction], profile_ms: dict[Key, float],
                  served: set[Key] = frozenset()) -> dict[Key, Inferred]:
    """Figures for the points no instance has served (not in `served`, no correction), carried
    from the corrections, each by the rule of the closest cause, the first that applies:
    1. the other runtimes of a corrected ⟨t, b⟩ take half its log-ratio served / profile
       (SIBLING_SHARE): one profile run measured them side by side, but an error may also be the
       runtime's own;
    2. the batches next to a corrected one (b / 2 and 2b, same threads and runtime) take half its
       log-ratio (NEIGHBOUR_SHARE; the mean of both where both neighbours are corrected).
    Bounded: an inferred figure moves at most half as far, in ratio, as a served one did. Served
    figures replace inferred ones as soon as they exist (the caller leaves the served keys out).

    Checked (benchmarks/inferred_check.py; BENCHMARKS.md, issue 42) on pairs of profiles of one
    model, each point of the second taken as served in turn: neighbouring batches came closer to
    the served figure than the profile's in 88-95 % of 940 cases on the 16-core reference tables
    (glibc against tcmalloc) and 56-62 % on two 2-core SqueezeNet profiles; other runtimes of the
    point in 73-80 % (half the ratio; the whole ratio: 41-75 %). A third rule, the whole profile
    moved by the median ratio of two or more served points that agree in direction (a machine that
    drifted), came closer in only 7-32 % of cases on three of the four reference pairs, however
    strictly "agree" was drawn (three points within 10 % of each other; the same thread count
    alone): it is not applied. A drift shows itself point by point as the plans serve them."""
    known = set(corrections) | set(served)
    ratios = {key: c.served_ms / c.profile_ms for key, c in corrections.items() if c.profile_ms > 0}
    found: dict[Key, Inferred] = {}
    for key, ms in profile_ms.items():
        if key in known:
            continue
        carried = _from_siblings(key, ratios) or _from_neighbours(key, ratios)
        if carried is not None:
            ratio, rule, source = carried
            found[key] = Inferred(*key, ms, ms * ratio, rule, source)
    return found


def _from_siblings(key: Key, ratios: dict[Key, float]):
    found = [(ratio, other) for other, ratio in ratios.items() if other[:2] == key[:2]]
    if not found:
        return None
    ratio = math.exp(statistics.fmean(math.log(r) for r, _ in found) * SIBLING_SHARE)
    return ratio, "runtimes of a served point", ", ".join(_name(other) for _, other in found)


def _from_neighbours(key: Key, ratios: dict[Key, float]):
    threads, batch, runtime = key
    found = [(ratios[other], other) for other in ((threads, batch // 2, runtime), (threads, batch * 2, runtime))
             if other in ratios and other[1] >= 1]
    if not found:
        return None
    ratio = math.exp(statistics.fmean(math.log(r) for r, _ in found) * NEIGHBOUR_SHARE)
    return ratio, "batches next to a served point", ", ".join(_name(other) for _, other in found)


def _name(key: Key) -> str:
    return f"⟨{key[0]}, {key[1]}, {key[2]}⟩"
