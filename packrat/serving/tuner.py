"""The plan tuned to what is served: at every look (the engine's, every CHECK_EVERY_S), the figures
planned on follow the bodies served (payloads.py: served figures of the profile's payload, or the
model's own for raw tensors), the profile is corrected by the served figures (correcting.py), the
served plan is compared with the best one on the corrected figures (served.SwitchPolicy), and a
near-tie the profile cannot settle is tried (trials.py). Every switch goes through the controller's
zero-downtime reconfiguration."""

from __future__ import annotations

import logging
import time
from typing import Callable

from packrat.models.runtimes import instance_kind
from packrat.planning.planner import Plan
from packrat.serving.correcting import PlanCorrector
from packrat.serving.payloads import PayloadWatch
from packrat.serving.served import SwitchPolicy, served_key
from packrat.serving.trials import GIVE_UP_SAMPLES, KEEP_MARGIN, Trial, TrialPolicy, near_tie

ROUNDS = ", from dispatch to hand-out"  # a trial's figures said so where they are its rounds
log = logging.getLogger(__name__)


def plan_keys(plan: Plan) -> list:
    return [served_key(i.threads, i.batch, i.runtime) for i in plan.instances]


class PlanTuner:
    """`controller` serves the plan (its plan, request(), switching, estimator); `pool` times it
    (served_figures); `plan_for(batch, profile=...)` plans a batch on the corrected profile, or on
    the one given."""

    def __init__(self, controller, pool, corrector: PlanCorrector, plan_for: Callable[..., Plan],
                 switches: SwitchPolicy | None = None, trials: TrialPolicy | None = None, wall=time.time):
        self.controller, self.pool, self.corrector, self.plan_for = controller, pool, corrector, plan_for
        self.switches = switches or SwitchPolicy()
        self.trials = trials or TrialPolicy()
        self.wall = wall
        # the plan a trial replaced, what it served (model stages) and its rounds (dispatch to hand-out)
        self._before: tuple[Plan, dict, dict] | None = None
        self.payloads = PayloadWatch(corrector.base.payload, corrector.base.basis)
        self._basis_moved = False  # whether the plan was ever made on another basis than the first

    def look(self, reconfigure: bool = True) -> None:
        """Correct the profile where the instances served otherwise than it predicted; then, when
        the engine follows what is served (`reconfigure`), follow an active trial, or switch to a
        better plan on the corrected figures, or try a near-tie."""
        basis = self.payloads.look(*self.pool.take_bodies())
        if basis is not None:
            raw, decoded = self.payloads.judged
            log.info("packrat plans on %s figures: %d of the last %d bodies were %s", basis, max(raw, decoded),
                     raw + decoded, "raw tensors" if raw >= decoded else "decoded (images, text, JSON)")
            self.corrector.plan_on(basis)
            self._basis_moved = True
        if self.corrector.host_in_processes(self.payloads.decoding):
            self._basis_moved = True
        if self._move_threads():  # also under --no-reconfigure: the same batch, hosted otherwise
            return
        if self.trials.active is not None:
            if reconfigure:
                self._follow_trial()
            return
        served = self.pool.served_figures()
        for c in self.corrector.update(served):
            log.info("packrat served ⟨%d threads, batch %d, %s⟩ in %.2f ms (median of %d batches), the profile "
                     "says %.2f ms: planning with the served figure", c.threads, c.batch, c.runtime, c.served_ms,
                     c.samples, c.profile_ms)
        if not reconfigure or self.controller.switching:
            return
        if (self.corrector.corrections or self._basis_moved) and self._switch_if_better(served) != "keep":
            return
        self._try_near_tie(served)

    def _move_threads(self) -> bool:
        """Decoded bodies: a plan with thread instances moves to process ones at once, whatever the
        figures say (its decodes hold the interpreter lock the front end needs); whether it asked."""
        plan = self.controller.plan
        if not self.corrector.processes_only or self.controller.switching or all(instance_kind(i.runtime) == "process" for i in plan.instances):
            return False
        reason = ("bodies are decoded (JSON, images, text): instances as processes, so that no decode holds the "
                  "server's interpreter lock")
        log.info("packrat re-plans: %s", reason)
        return bool(self.controller.request(plan.batch, reason))

    def status(self) -> dict:
        return {"held_back": self.switches.status(), "trials": self.trials.status(), "payload": self.payloads.status()}

    # ---- a better plan on the corrected figures ---------------------------------------------------

    def _switch_if_better(self, served: dict) -> str:
        """Taken again at every look, not only on a new correction: a switch the cool-down held
        back happens when the cool-down ends (SwitchPolicy). A plan better on paper that runs points
        nothing has served is tried rather than switched to (_try): its figures are the profile's,
        taken on a quiet machine, where the served plan's were served under the load of the moment.
        Returns the verdict."""
        plan = self.controller.plan
        current_ms, proposed = self.corrector.expected_ms(plan), self.plan_for(plan.batch)
        proposed_ms = self._paired_ms(plan, current_ms, proposed)
        held = self.switches.held
        verdict = self.switches.decide(plan.describe(), current_ms, proposed.describe(), proposed_ms)
        if verdict == "hold" and (held is None or held.plan != proposed.describe()):
            log.info("packrat holds back %s (expected %.1f ms against %.1f as served) until the cool-down ends in "
                     "%.0f s", proposed.describe(), proposed_ms, current_ms,
                     self.switches.status()["cooldown_left_s"])
        if verdict == "switch":
            figures = "served latencies" if self.corrector.corrections else f"{self.corrector.base.basis} figures"
            reason = (f"{figures}: {plan.describe()} takes {current_ms:.1f} ms as served, "
                      f"{proposed.describe()} is expected to take {proposed_ms:.1f} ms")
            if self._untried(proposed, served) and all(k in served for k in plan_keys(plan)):
                if self.trials.may_start():
                    self._try(plan, proposed, current_ms, served, f"trial: {reason}")
                return "trial"
            log.info("packrat re-plans: %s", reason)
            if self.controller.request(plan.batch, reason):
                self.switches.switched()
        return verdict

    def _untried(self, plan: Plan, served: dict) -> tuple:
        """The points of `plan` that nothing has served: neither now nor in a correction kept."""
        return tuple(sorted({k for k in plan_keys(plan) if k not in served and k not in self.corrector.corrections}))

    def _paired_ms(self, plan: Plan, current_ms: float, proposed: Plan) -> float:
        """The proposed plan's expected ms; where it lost a trial against the served plan (and the
        trial's figures are still planned with), its figure then scaled by how far the served plan's
        moved since: the trial paired the two in time, and the tried plan, not served again, would
        otherwise look better whenever the machine slows (docs/serving.md, trials)."""
        for trial in reversed(self.trials.history):
            lost = (trial.outcome or "").startswith(("reverted: served", "given up"))
            if (trial.plan == proposed.describe() and trial.previous == plan.describe() and lost
                    and trial.served_ms and trial.previous_ms
                    and all(key in self.corrector.corrections for key in trial.untried)):
                return max(proposed.expected_latency_ms, trial.served_ms * current_ms / trial.previous_ms)
        return proposed.expected_latency_ms

    # ---- near-ties, tried ------------------------------------------------------------------------

    def _try_near_tie(self, served: dict) -> None:
        """Serve, for a trial, the best plan without the served plan's slowest point, when the
        profile cannot tell the two apart and it runs a point nothing has served yet."""
        plan = self.controller.plan
        keys = plan_keys(plan)
        if (not self.trials.may_start() or not self.switches.calm() or any(k not in served for k in keys)
                or self.controller.estimator.current != plan.batch):
            return  # not while the load or the plan moves, nor before the served plan has its figures
        points = self.corrector.profile.points()
        slowest = max(keys, key=lambda k: points.get(k, 0.0))
        other = self.plan_for(plan.batch, profile=self.corrector.without([slowest]))
        if not self._untried(other, served) or other.describe() == plan.describe():
            return
        profile = self.corrector.profile
        other_slowest = max(plan_keys(other), key=lambda k: points.get(k, 0.0))
        current_ms = self.corrector.expected_ms(plan, {k: served[k][0] for k in keys})
        if not near_tie(current_ms, profile.spread_ms(*slowest), other.expected_latency_ms,
                        profile.spread_ms(*other_slowest)):
            return
        self._try(plan, other, current_ms, served,
                  f"trial: {other.describe()} is expected within the noise of {plan.describe()} "
                  f"({other.expected_latency_ms:.1f} against {current_ms:.1f} ms as served)")

    def _try(self, plan: Plan, other: Plan, current_ms: float, served: dict, reason: str) -> None:
        """Serve `other` for a trial instead of the served `plan` (whose points all have `served`
        figures): kept or reverted by what it serves (_follow_trial)."""
        trial = Trial(plan.describe(), other.describe(), current_ms, other.expected_latency_ms,
                      self._untried(other, served), self.trials.clock(), self.wall())
        rounds = self.pool.served_figures(rounds=True)  # before the switch, which forgets them
        if self.controller.request(plan.batch, reason, plan_for=lambda _: other, attempts=1):
            log.info("packrat %s", reason)
            self.trials.start(trial)
            self._before = (plan, {k: served[k] for k in plan_keys(plan)}, rounds)

    def _follow_trial(self) -> None:
        """End the active trial once its verdict is in: keep the plan tried when it served faster
        than the one it replaced by KEEP_MARGIN, else switch back; what both served is planned with
        from now on."""
        trial = self.trials.active
        if self.controller.switching:
            return
        plan = self.controller.plan
        if plan.describe() != trial.plan:  # the switch failed, or the load moved the plan on
            self._end("interrupted: the plan is now " + plan.describe())
            return
        figures = self.pool.served_figures(GIVE_UP_SAMPLES)
        keys = plan_keys(plan)
        served_ms = (self.corrector.expected_ms(plan, {k: figures[k][0] for k in keys})
                     if all(k in figures for k in keys) else None)
        verdict = self.trials.verdict(min((figures[k][2] if k in figures else 0) for k in keys), served_ms)
        if verdict == "wait":
            return
        previous, before, before_rounds = self._before
        if verdict != "inconclusive":
            self.corrector.record({**before, **{k: figures[k] for k in keys}})
        previous_ms = self.corrector.expected_ms(previous)
        rounds = self._rounds(plan, previous, before_rounds) if verdict == "end" else None
        if rounds is not None:  # weighed as served, each kind's path in its figure (later pairings use them too)
            trial.served_ms, trial.previous_ms = served_ms, previous_ms = rounds
        if verdict == "end" and served_ms <= previous_ms * (1 - KEEP_MARGIN):
            self._end(f"kept: served {served_ms:.1f} ms against {previous_ms:.1f}{ROUNDS if rounds else ''}")
            return
        why = {"end": f"reverted: served {served_ms:.1f} ms against {previous_ms:.1f}{ROUNDS if rounds else ''}",
               "give up": f"given up: served {served_ms:.1f} ms against {previous_ms:.1f} after {trial.batches} batches",
               "inconclusive": f"reverted: {trial.batches} batches in {self.trials.max_s:.0f} s"}[verdict]
        self.controller.request(plan.batch, f"{why} ({trial.plan} tried)", plan_for=lambda _: previous, attempts=1)
        self._end(why)

    def _rounds(self, plan: Plan, previous: Plan, before: dict) -> tuple[float, float] | None:
        """(the plan tried, the plan it replaced): each one's slowest instance's median round as
        served, from dispatch to hand-out, where both have them. A kind's path is in its round as
        it is served: behind an HTTP front end the profile's path figures understated the process
        kind's against the thread kind's, and a trial kept the slower one (docs/serving.md)."""
        now = self.pool.served_figures(GIVE_UP_SAMPLES, rounds=True)
        tried, replaced = plan_keys(plan), plan_keys(previous)
        if not all(k in now for k in tried) or not all(k in before for k in replaced):
            return None
        return max(now[k][0] for k in tried), max(before[k][0] for k in replaced)

    def _end(self, outcome: str) -> None:
        trial = self.trials.finish(outcome)
        self.switches.switched()  # the cool-down starts: no switch on paper right after a trial
        log.info("packrat trial of %s against %s ended after %.0f s: %s", trial.plan, trial.previous,
                 trial.seconds, outcome)
