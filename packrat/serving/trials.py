"""Near-ties settled by trying: when the profile cannot tell the served plan from another one, the
engine serves the other for a short, bounded trial and keeps it when it served faster by the
switch margin (KEEP_MARGIN), else goes back. Pure: the clock
and the figures come in, verdicts go out (the engine switches; trials never fail a request, since
they switch through the zero-downtime reconfiguration like every other switch).

Why: a configuration that is not served is never measured again. BERT-base at B = 4 had inductor
and OpenVINO level in its profile (354.3 against 356.0 ms); OpenVINO served 14 % faster, and the
engine kept inductor (BENCHMARKS.md, issue 42).

The alternative to the served plan is the best plan on the corrected figures with the served plan's
slowest point left out. It is a near-tie when it is expected within the noise of the served plan
(near_tie: the two points' profile spreads added, at least SWITCH_MARGIN, the margin a switch on
paper needs, at most MAX_TIE), and it is tried only when it runs a point nothing has served yet.

The cost of trying is bounded:
- a trial ends at the first look (the engine looks every 5 s) after its plan served TRIAL_BATCHES
  batches (its served figure then has as many samples as a correction needs), and TRIAL_MAX_S
  seconds after its plan began to serve at most;
- it is given up after GIVE_UP_SAMPLES batches when the alternative serves more than
  GIVE_UP_MARGIN slower than the plan it replaced;
- trials start TRIAL_GAP_S apart at least, and a point is tried once: what a trial served is kept
  as a correction (so it is planned with, and expires like one);
- and it costs two switches at most (there and back).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

from packrat.serving.served import MIN_SAMPLES, SWITCH_MARGIN, Key

TRIAL_BATCHES = MIN_SAMPLES  # the batches a trial serves: as many as a correction needs
TRIAL_MAX_S = 60.0  # ... and the longest it lasts
GIVE_UP_SAMPLES = 5  # after this many batches ...
GIVE_UP_MARGIN = 0.20  # ... a trial serving this much slower than the plan it replaced is given up
TRIAL_GAP_S = 120.0  # from the end of one trial to the start of the next, at least
# The plan tried is kept only when it served faster by this much; else the plan it replaced comes
# back: the two are level, and a level trial decided the wrong way (BERT-base at B = 1, inductor kept
# for serving 1.5 % faster, then 8 % slower in the peers run: BENCHMARKS.md, issue 42).
KEEP_MARGIN = SWITCH_MARGIN
HISTORY = 20  # trials kept for status
# A plan expected this much slower is no near-tie, whatever the spreads: a trial serves live traffic,
# so its cap is narrower than settling's before serving (planning/settling.py).
MAX_TIE = 0.15


def near_tie(current_ms: float, current_spread_ms: float, other_ms: float, other_spread_ms: float) -> bool:
    """Whether a plan expected to take `other_ms` cannot be told from the served one's `current_ms`
    by the profile: slower by less than the two points' spreads added (at least SWITCH_MARGIN, at
    most MAX_TIE of current_ms). A plan faster beyond the margin is no tie: switched to on paper."""
    band = min(MAX_TIE * current_ms, max(SWITCH_MARGIN * current_ms, current_spread_ms + other_spread_ms))
    return current_ms * (1 - SWITCH_MARGIN) <= other_ms <= current_ms + band


@dataclass
class Trial:
    """One plan served for a trial instead of `previous`."""
    previous: str  # the plan it replaced
    plan: str  # the plan tried
    previous_ms: float  # the plan it replaced, expected on its served figures (its round as served, once judged so)
    expected_ms: float  # the plan tried, expected on the profile's figures (corrected)
    untried: tuple[Key, ...]  # the points it runs that nothing had served
    started: float  # the clock's time it was asked for
    started_at: float  # unix time, for logs and timelines
    served_ms: float | None = None  # the plan tried, expected on what it served (its round, once judged so)
    batches: int = 0  # the fewest batches any of its points served
    serving_since: float | None = None  # the clock's time its plan began to serve (the switch done)
    outcome: str | None = None  # "kept", "reverted", "given up" or "interrupted", with why
    seconds: float = 0.0  # how long it lasted

    def to_json(self) -> dict:
        found = asdict(self)
        found["untried"] = [list(key) for key in self.untried]
        return found


@dataclass
class TrialPolicy:
    """When a near-tie is tried and when its trial ends. `clock`: monotonic seconds; tests drive it."""
    clock: object = time.monotonic
    gap_s: float = TRIAL_GAP_S
    max_s: float = TRIAL_MAX_S
    active: Trial | None = None
    history: list[Trial] = field(default_factory=list)
    next_at: float = 0.0  # no trial starts before this

    def may_start(self) -> bool:
        return self.active is None and self.clock() >= self.next_at

    def start(self, trial: Trial) -> None:
        self.active = trial

    def verdict(self, batches: int, served_ms: float | None) -> str:
        """"wait", "end" (its points served TRIAL_BATCHES batches, or it served TRIAL_MAX_S with
        GIVE_UP_SAMPLES at least), "give up" (GIVE_UP_SAMPLES batches served more than GIVE_UP_MARGIN
        slower than the plan it replaced) or "inconclusive" (TRIAL_MAX_S with fewer batches), for the
        active trial whose points served `batches` batches at least, `served_ms` on their figures
        (None before GIVE_UP_SAMPLES)."""
        trial = self.active
        trial.batches, trial.served_ms = batches, served_ms
        if served_ms is not None and served_ms > trial.previous_ms * (1 + GIVE_UP_MARGIN):
            return "give up"
        if batches >= TRIAL_BATCHES:
            return "end"
        if trial.serving_since is None:
            trial.serving_since = self.clock()
        if self.clock() - trial.serving_since >= self.max_s:
            return "end" if served_ms is not None else "inconclusive"
        return "wait"

    def finish(self, outcome: str) -> Trial:
        """The active trial ends with `outcome`; the next may start gap_s from now."""
        trial, now = self.active, self.clock()
        trial.outcome, trial.seconds = outcome, now - trial.started
        self.history = (self.history + [trial])[-HISTORY:]
        self.active, self.next_at = None, now + self.gap_s
        return trial

    def status(self) -> dict:
        return {"active": self.active.to_json() if self.active else None,
                "history": [t.to_json() for t in self.history]}
