"""The engine's profile, corrected by what its instances serve (the rules: served.py), and kept on
file so that a restart plans with the corrections: one JSON file per model and profile under
the served-latency folder (settings.SERVED_DIR_ENV), named by a digest of the profile's bytes (a profile taken again starts afresh).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import time
from pathlib import Path

from packrat.models.runtimes import instance_kind
from packrat.profiling.profiles import Profile
from packrat.serving.served import Correction, corrections_from, inferred_from, served_key
from packrat.settings import SERVED_DIR_ENV

log = logging.getLogger(__name__)
CHECK_EVERY_S = 5.0  # how often the served figures are compared with the planned ones
LEFT_OUT_MS = 1e9  # a figure no plan takes (without())


def corrections_file(model_name: str, profile_path: Path) -> Path:
    """Where the corrections of `model_name` served with the profile at `profile_path` are kept."""
    digest = hashlib.sha256(Path(profile_path).read_bytes()).hexdigest()[:16]
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", model_name)
    return SERVED_DIR_ENV.get() / f"{safe}-{digest}.json"


class PlanCorrector:
    """The profile to plan with: `base`, its figures corrected by the served ones kept at `path`
    (None: kept in memory only) and by those update() finds. With `keep` False the file is read
    but not written: a model sharing the node with others serves beside a mix of models and loads
    that comes and goes, so what it serves is not the point's figure on this machine (one such run
    kept SqueezeNet's ⟨2 threads, batch 4⟩ at 369 ms against its profile's 11.4 for a day:
    BENCHMARKS.md, issue 33)."""

    def __init__(self, base: Profile, path: Path | None, clock=time.monotonic, wall=time.time,
                 every_s: float = CHECK_EVERY_S, keep: bool = True):
        self.base, self.clock, self.wall, self.every_s = base, clock, wall, every_s
        self.path, self.keep = path, keep
        self.processes_only = False  # thread-kind points left out: bodies are decoded (host_in_processes)
        self.corrections = self._load()
        # figures carried from the corrections to the points that share their cause (served.py)
        self.inferred = inferred_from(self.corrections, self.base.model_points())
        self.profile = self._corrected()
        self._next_check = clock() + every_s

    def plan_on(self, basis: str) -> None:
        """Plan on the profile's `basis` figures (profiles.BASES) from now on: the corrections, made on
        the model's own figures, hold on either."""
        self.base = self.base.on(basis)
        self.profile = self._corrected()

    def host_in_processes(self, processes_only: bool) -> bool:
        """Plan without the thread-kind points (or with them again); whether that changed anything.
        A thread instance decodes its bodies (JSON, images, text) in the server's process, under its
        interpreter lock: the front end answering, and refusing, requests waits for every decode."""
        if processes_only and not any(instance_kind(r) == "process" for r in self.base.measured_runtimes):
            return False
        changed, self.processes_only = processes_only != self.processes_only, processes_only
        self.profile = self._corrected()
        return changed

    def due(self) -> bool:
        """Whether a check is due (once per every_s)."""
        now = self.clock()
        if now < self._next_check:
            return False
        self._next_check = now + self.every_s
        return True

    def update(self, served: dict) -> list[Correction]:
        """Take the pool's served figures ((threads, batch, runtime) -> (median ms, error, samples)):
        each instance's model stage, compared with the profile's model-only figure (Profile.model_points;
        a served figure the profile plans on moves by as much: Profile.corrected); returns the
        corrections they made (the profile to plan with is then `profile`)."""
        now = self.wall()
        corrections = corrections_from(served, self.base.model_points(), self.corrections, now)
        changed = [c for key, c in corrections.items() if self.corrections.get(key) != c]
        inferred = inferred_from(corrections, self.base.model_points(), set(served))
        kept_changed = bool(changed) or corrections.keys() != self.corrections.keys()
        if not kept_changed and inferred == self.inferred:
            return []
        self.corrections, self.inferred = corrections, inferred
        self.profile = self._corrected()
        if kept_changed:  # inferred figures are not kept: they follow from the corrections
            self._save()
        return changed

    def record(self, served: dict) -> None:
        """Plan with these served figures ((threads, batch, runtime) -> (median ms, error, samples))
        whether or not they disagree with the profile beyond the noise: a trial measured them to
        tell a near-tie apart (trials.py), and a point once served need not be tried again."""
        now, base = self.wall(), self.base.model_points()
        for key, (median, _, samples) in served.items():
            if key in base:
                self.corrections[key] = Correction(*key, base[key], median, samples, now)
        self.inferred = inferred_from(self.corrections, base, set(served))
        self.profile = self._corrected()
        self._save()

    def expected_ms(self, plan, served: dict | None = None) -> float:
        """The plan's latency on the corrected figures (and `served` model-stage figures, keyed
        (threads, batch, runtime), where given): its slowest instance's."""
        points = (self._corrected(served).points() if served else self.profile.points())
        return max(points.get((i.threads, i.batch, i.runtime), i.latency_ms) for i in plan.instances)

    def without(self, keys) -> Profile:
        """The corrected profile with `keys` ((threads, batch, runtime)) left out: their figures so
        large that no plan takes them (another runtime of the point may stand in)."""
        return self._corrected({key: LEFT_OUT_MS for key in keys})

    def status(self, plan, served: dict) -> dict:
        """Predicted (the profile's model-only figure, as the served model stage is timed), planned
        with (corrected; the served figure where the profile plans on those) and served per instance
        of `plan`, and every correction."""
        base, planned = self.base.model_points(), self.profile.points()
        instances = []
        for i in plan.instances:
            key = served_key(i.threads, i.batch, i.runtime)
            median, _, samples = served.get(key, (None, None, 0))
            instances.append({"threads": i.threads, "batch": i.batch, "runtime": i.runtime,
                              "predicted_ms": base.get(key), "planned_ms": planned.get(key),
                              "served_ms": median, "samples": samples})
        return {"instances": instances, "corrections": [c.to_json() for c in self.corrections.values()],
                "inferred": [i.to_json() for i in self.inferred.values()]}

    def _corrected(self, extra: dict | None = None) -> Profile:
        figures = {key: i.inferred_ms for key, i in self.inferred.items()}
        figures.update((key, c.served_ms) for key, c in self.corrections.items())  # served beats inferred
        profile = self.base.corrected({**figures, **(extra or {})})
        if not self.processes_only:
            return profile
        return profile.only([r for r in profile.measured_runtimes if instance_kind(r) == "process"])

    def _load(self) -> dict:
        if self.path is None or not self.path.exists():
            return {}
        try:
            found = [Correction(**entry) for entry in json.loads(self.path.read_text())["corrections"]]
        except (OSError, ValueError, KeyError, TypeError) as exc:  # a damaged file costs the corrections only
            log.warning("packrat: ignoring the served latencies in %s: %s", self.path, exc)
            return {}
        kept = corrections_from({}, self.base.model_points(), {c.key: c for c in found}, self.wall())
        if kept:
            log.info("packrat: planning with %d served latencies kept in %s", len(kept), self.path)
        return kept

    def _save(self) -> None:
        if self.path is None or not self.keep:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            partial = self.path.with_name(f".{self.path.name}.{os.getpid()}")
            partial.write_text(json.dumps({"corrections": [c.to_json() for c in self.corrections.values()]}, indent=1))
            partial.replace(self.path)
        except OSError as exc:  # not kept for a restart, but still planned with
            log.warning("packrat: cannot keep the served latencies in %s: %s", self.path, exc)
