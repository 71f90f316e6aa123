"""A step load (`packrat bench --shape step`): low → high → low … locust users against the packrat
handler with reconfiguration on, and with the plan fixed for the high and for the low batch size;
how long each switch of plans took and what it did to the p99."""

from __future__ import annotations

import statistics
from pathlib import Path

from packrat.bench.servers import warmed_server
from packrat.deploy import archive, torchserve
from packrat.settings import Settings


def step_bench(model: str, batch: int, profile_path: Path, out_dir: Path, *, low: int = 1, cycles: int = 10,
               step_s: float = 12.0, warmup_s: float = 6.0, max_batch_delay_ms: int = 50,
               payload: str | None = None, tokenizer: Path | None = None, log=print) -> dict:
    """A low → high → low … locust load against the packrat handler with reconfiguration on,
    and with the plan fixed for the high and for the low batch size."""
    from packrat.loadtest import plot_timeline, run_locust
    from packrat.loadtest.env import STEP_SECONDS, STEP_USERS
    from packrat.codec.payloads import build_payload

    body = build_payload(model, payload)
    users = ",".join([str(low), str(batch)] * cycles + [str(low)])
    configs = (("reconfigure-on", True, batch), ("fixed-plan-B%d" % batch, False, batch),
               ("fixed-plan-B%d" % low, False, low))
    results = {}
    for name, reconfigure, plan_batch in configs:
        run_dir = out_dir / name
        settings = Settings(model, profiles=[profile_path], max_batch=batch, reconfigure=reconfigure,
                            plan_batch=plan_batch, tokenizer=tokenizer)
        mar = archive.build(settings, run_dir / "model_store", name=model, max_batch_delay_ms=max_batch_delay_ms)
        with warmed_server(name, model, mar, run_dir, batch, warmup_s, log, payload=body) as (server, token):
            log(f"-- {name}: step load {users} users, {step_s:.0f} s per step")
            result = run_locust(server.inference_url, model, batch, step_s * (2 * cycles + 1), run_dir / "load",
                                token=token, payload=body, shape="step",
                                env={STEP_USERS.name: users, STEP_SECONDS.name: str(step_s)})
            status = torchserve.handler_status(server)
        switches = [r for r in status["reconfigurations"] if r["started_at"] >= (result.start_time or 0)]
        markers = [(r["started_at"] + r["seconds"], f"B={r['to_batch']}") for r in switches]
        png = plot_timeline(result.history, out_dir / f"timeline-{name}.png", markers)
        results[name] = {"load": result, "reconfigurations": switches, "timeline": str(png),
                         **switch_figures(result, switches)}
    return results


def switch_figures(result, switches: list[dict]) -> dict:
    """Switch durations, and p99 in the seconds of each switch against the new plan's
    steady p99 (the rest of its step), from locust's per-second history."""
    ok = [r for r in switches if not r.get("error")]
    ratios = []
    for r, following in zip(ok, ok[1:] + [None]):
        begin, end = r["started_at"], r["started_at"] + r["seconds"] + 1.0
        during = [h.p99_ms for h in result.history if begin <= h.timestamp <= end and h.p99_ms == h.p99_ms]
        settle_end = following["started_at"] if following else float("inf")
        steady = [h.p99_ms for h in result.history if end + 2 <= h.timestamp < settle_end and h.p99_ms == h.p99_ms]
        if during and steady:
            ratios.append(max(during) / statistics.median(steady))
    return {
        "switches": len(ok),
        "failed_switches": len(switches) - len(ok),
        "failed_requests": result.failures,
        "switch_seconds_median": statistics.median([r["seconds"] for r in ok]) if ok else None,
        "switch_seconds_max": max((r["seconds"] for r in ok), default=None),
        "switch_p99_ratio_median": statistics.median(ratios) if ratios else None,
        "switch_p99_ratio_max": max(ratios, default=None),
    }


def format_step_results(results: dict) -> str:
    lines = [f"{'config':<18} {'requests':>8} {'failures':>8} {'p50 ms':>7} {'p99 ms':>7} {'req/s':>6} "
             f"{'switches':>8} {'switch s (med/max)':>18} {'p99 in switch / steady (med/max)':>33}"]
    for name, r in results.items():
        load = r["load"]
        secs = (f"{r['switch_seconds_median']:.2f}/{r['switch_seconds_max']:.2f}"
                if r["switch_seconds_median"] is not None else "-")
        ratio = (f"{r['switch_p99_ratio_median']:.2f}/{r['switch_p99_ratio_max']:.2f}"
                 if r["switch_p99_ratio_median"] is not None else "-")
        lines.append(f"{name:<18} {load.requests:>8} {load.failures:>8} {load.p50_ms:>7.1f} {load.p99_ms:>7.1f} "
                     f"{load.throughput_rps:>6.1f} {r['switches']:>8} {secs:>18} {ratio:>33}")
    return "\n".join(lines)
