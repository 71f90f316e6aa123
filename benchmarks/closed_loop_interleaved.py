"""Closed loop with exactly B users, stock TorchServe vs packrat, in interleaved rounds.

On a small shared VM one locust run per configuration measures the day's noise as much as the
servers (±25 % between identical configurations in one `packrat bench` run). Here every server
is started once and kept up (idle servers take no CPU), then each round loads each of them in a
shuffled order; medians over the rounds and the packrat/stock ratios are printed, then the same
with every round's requests pooled (percentiles of all of them together: a p99 from one 15 s
round rests on its two or three slowest requests, so the median of rounds' p99s is mostly noise),
with the JSON.

    .venv/bin/python benchmarks/closed_loop_interleaved.py [MODEL] [B,...] [ROUNDS] [SECONDS] [OUT] [CONFIGS]

CONFIGS (default all; stock always runs, the ratios' reference): packrat-plan (the planned
instances), packrat-fat (one instance on every core: the same model on the same cores as stock,
so the ratio is the pool's tax). The packrat servers plan from profiles/MODEL.csv; TorchServe's
maxBatchDelay is 50 ms.
"""
from __future__ import annotations

import random
import statistics
import sys
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: benchmarks.common
from benchmarks.common import name_list, positional_args
from packrat.bench.results import write_json
from packrat.profiling.profiles import default_path as default_profile_path
from packrat.cli.types import int_list

from packrat.loadtest import run_locust
from packrat.bench.payloads import build_payload
from packrat.bench.server import pooled, warmed_server
from packrat.deploy import archive
from packrat.settings import Settings

CONFIGS = (("stock", "stock", "auto"), ("packrat-plan", "packrat", "auto"), ("packrat-fat", "packrat", "fat"))


def measure(model: str, batch: int, rounds: int, seconds: float, out: Path, configs, payload) -> dict:
    """Every configuration's server up side by side, then `rounds` shuffled rounds of `seconds` of
    load on each: each round's figures, their medians, and every round's requests pooled."""
    profile = default_profile_path(model)
    samples: dict[str, list] = {name: [] for name, *_ in configs}
    runs: dict[str, list] = {name: [] for name, *_ in configs}
    with ExitStack() as stack:
        servers = {}
        for name, handler, plan in configs:
            run_dir = out / f"B{batch}" / name
            # The servers stay up side by side and are loaded one at a time: each plans for the whole
            # machine, as if alone, rather than share the cores with the idle others (share_node).
            settings = Settings(model, profiles=[profile] if handler == "packrat" else [], max_batch=batch, plan=plan,
                                reconfigure=False, share_node=False)
            mar = archive.build(settings, run_dir / "model_store", name=model, handler=handler, max_batch_delay_ms=50)
            servers[name] = stack.enter_context(warmed_server(name, model, mar, run_dir, batch, 8.0, print, payload=payload))
        order = list(servers)
        for r in range(rounds):
            random.Random(r).shuffle(order)
            for name in order:
                server, token = servers[name]
                result = run_locust(server.inference_url, model, batch, seconds, out / f"B{batch}" / name / f"r{r}",
                                    token=token, payload=payload)
                samples[name].append({"p50": result.p50_ms, "p99": result.p99_ms, "rps": result.throughput_rps,
                                      "failures": result.failures})
                runs[name].append(result)
                print(f"B={batch} round {r} {name}: p50 {result.p50_ms:.0f} p99 {result.p99_ms:.0f} "
                      f"rps {result.throughput_rps:.1f}", flush=True)
    medians = {name: {k: statistics.median(s[k] for s in rows) for k in ("p50", "p99", "rps")}
               for name, rows in samples.items()}
    together = {name: pooled(results, seconds) for name, results in runs.items()}
    return {"rounds": samples, "medians": medians,
            "pooled": {name: {"p50": r.p50_ms, "p99": r.p99_ms, "rps": r.throughput_rps, "requests": r.requests,
                              "failures": r.failures} for name, r in together.items()}}


def main() -> None:
    model, batches, rounds, seconds, out, chosen = positional_args(
        __doc__, ("model", str, "resnet50"), ("batches", int_list, [4, 8]), ("rounds", int, 5),
        ("seconds", float, 15.0), ("out", Path, Path("out/interleaved")),
        ("configs", name_list, [name for name, *_ in CONFIGS]))
    unknown = set(chosen) - {name for name, *_ in CONFIGS}
    if unknown:
        raise SystemExit(f"unknown configs {sorted(unknown)}: choose from {', '.join(name for name, *_ in CONFIGS)}")
    payload = build_payload(model)  # the model's natural body
    configs = [config for config in CONFIGS if config[0] == "stock" or config[0] in chosen]
    report = {batch: measure(model, batch, rounds, seconds, out, configs, payload) for batch in batches}
    for figure, how in (("medians", "medians of the rounds"), ("pooled", "every round's requests pooled")):
        print(f"\n{model}, closed loop with B users, {rounds} interleaved rounds of {seconds:.0f} s, payload "
              f"{payload[1]} ({len(payload[0])} bytes); {how} (locust on the same cores)")
        print(f"{'B':>3}  {'config':<28} {'p50 ms':>7} {'p99 ms':>7} {'req/s':>6}  {'p50 vs stock':>12} "
              f"{'p99 vs stock':>12}")
        for batch, entry in report.items():
            stock = entry[figure]["stock"]
            for name, m in entry[figure].items():
                print(f"{batch:>3}  {name:<28} {m['p50']:>7.0f} {m['p99']:>7.0f} {m['rps']:>6.1f}  "
                      f"{m['p50'] / stock['p50']:>11.2f}x {m['p99'] / stock['p99']:>11.2f}x")
    write_json(out / "interleaved.json", report)


if __name__ == "__main__":
    main()
