"""Runtimes dropped from a profile where they are dominated. Pure: figures in, runtimes out.

The profiler measures every ⟨t, b⟩ under each runtime back to back, and the planner takes each
point's figure from the runtime that is fastest beyond the noise (profiles.choose_runtime). A
runtime that the chosen one beats beyond the noise at point after point will not be chosen at the
rest either, as a rule: ResNet-50 on 2 cores ran 4–11 % slower under inductor's AOT code than under
OpenVINO and ONNX Runtime at every point measured (BENCHMARKS.md, issue 25), and inductor's AOT
packages, built one per ⟨t, b⟩, cost 20–40 s each from a cold cache, most of the default profile's
time. So a runtime dominated at DROP_AFTER points in a row, and never faster than every other
beyond the noise, is measured no further. This is a rule of thumb, not a proof (a runtime could win at a point not yet measured);
`packrat profile --every-runtime` measures them all.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from packrat.profiling.profiles import choose_runtime, dominated

DROP_AFTER = 2  # points in a row at which a runtime is dominated before it is measured no further


@dataclass
class DominanceWatch:
    """Which of `runtimes` the profile still measures. point() hears each point's figures once every
    active runtime has measured it (planned-on figure and spread per runtime)."""
    runtimes: tuple[str, ...]
    drop_after: int = DROP_AFTER
    dropped: dict[str, str] = field(default_factory=dict)  # runtime -> why
    _streak: dict[str, list[str]] = field(default_factory=dict)  # runtime -> points dominated in a row
    _won: set[str] = field(default_factory=set)  # runtimes that beat all others somewhere: never dropped

    @property
    def active(self) -> tuple[str, ...]:
        return tuple(r for r in self.runtimes if r not in self.dropped)

    def point(self, threads: int, batch: int, figures: dict[str, tuple[float, float]]) -> list[str]:
        """The runtimes this point's figures drop (said in `dropped`)."""
        figures = {r: f for r, f in figures.items() if r not in self.dropped}
        if len(figures) < 2:
            return []
        chosen = choose_runtime(figures)
        beaten = dominated(figures)
        if len(beaten) == len(figures) - 1:  # a win beyond the noise, not a tie kept by the rule
            self._won.add(chosen)
        newly = []
        for runtime in figures:
            streak = self._streak.setdefault(runtime, [])
            if runtime not in beaten:
                streak.clear()
                continue
            streak.append(f"⟨{threads}, {batch}⟩ {figures[runtime][0]:.1f} ms against {chosen}'s "
                          f"{figures[chosen][0]:.1f}")
            if len(streak) >= self.drop_after and runtime not in self._won:
                self.dropped[runtime] = "dominated at " + "; ".join(streak[-self.drop_after:])
                newly.append(runtime)
        return newly
