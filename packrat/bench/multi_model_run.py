"""Several models on one machine: packrat's node plan against stock TorchServe, one packrat server
per model and a static split of the cores, under closed-loop locust load per model.

Configurations (--configs), each against every model served alone, in rotated rounds:
  packrat-node   one TorchServe, a packrat archive per model: the models plan the cores together
  stock          one TorchServe, a stock archive per model (TorchServe's default workers and threads)
  per-model      one packrat TorchServe per model, each planning for every core (share_node off)
  static-split   the same, each pinned to its own ⌊T/n⌋ cores
Parts (--part): targets, two models (--pair) both loaded then the second idle; mix, three (--mix)
under a load whose mix shifts every --phase-s. docs/multi-model.md says what it reports.

    packrat bench multi-model --part targets
    packrat bench multi-model --part mix --phase-s 60 --rounds 3"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path

from packrat.bench.results import fmt_num, markdown_table, median_text, write_json
from packrat.bench.servers import bert_tokenizer, torchserve_of, zoo_archives
from packrat.bench.multi_model import LEAD, Phase, alone_phase, normalised, over_all_rounds, schedule, summarise
from packrat.loadtest.env import STEP_SECONDS, STEP_USERS

CONFIGS = ("packrat-node", "stock", "per-model", "static-split")
CELLS = (("p50_ms", 0), ("p99_ms", 0), ("rps", 1), ("of_alone", 2), ("slowdown", 2), ("expected_slowdown", 2))


def target_phases(models: list[str], users: int, seconds: float, settle_s: float) -> list[Phase]:
    first, second = models
    return [Phase("warm-up", {first: users, second: users}, 25.0, 25.0, measured=False),
            Phase("both loaded", {first: users, second: users}, seconds, 0.0),
            Phase("second idle", {first: users, second: 0}, seconds + 2 * settle_s, 2 * settle_s)]


def mix_phases(models: list[str], heavy: int, light: int, seconds: float, settle_s: float) -> list[Phase]:
    images = [m for m in models if m != "bert_base"]

    def users(heavy_ones) -> dict[str, int]:
        return {m: heavy if m in heavy_ones else light for m in models}

    return [Phase("warm-up", users(models), 30.0, 30.0, measured=False),
            Phase("image-heavy", users(images), seconds, settle_s),
            Phase("text-heavy", users(["bert_base"]), seconds, settle_s),
            Phase("both", users(models), seconds, settle_s)]


# ---- servers ------------------------------------------------------------------------------------

@contextmanager
def pinned(cores: list[int]):
    """This process (and what it starts: Java, the workers, their pools) on `cores` meanwhile."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cores)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def start_server(stack: ExitStack, run_dir: Path, models: list[str], handler: str, args, tokenizer,
                 share_node: bool, cores: list[int]) -> tuple:
    """One TorchServe serving `models` with `handler`, pinned to `cores`: (the server, its inference key)."""
    from packrat.deploy import torchserve

    mars = zoo_archives(models, run_dir / "model_store", args.batch_size, handler=handler, tokenizer=tokenizer,
                        max_batch_delay_ms=args.max_batch_delay, share_node=share_node)
    print(f"   starting TorchServe for {', '.join(models)} ({handler}) on cores {cores}", flush=True)
    with pinned(cores):
        server = torchserve_of(run_dir, models, mars)
    stack.callback(torchserve.stop, server)
    return server, server.key("inference")


def static_blocks(models: list[str], cores: list[int]) -> dict[str, list[int]]:
    """⌊T/n⌋ cores per model (at least one; round robin when there are more models than cores)."""
    if len(models) > len(cores):
        return {m: [cores[i % len(cores)]] for i, m in enumerate(models)}
    width = len(cores) // len(models)
    return {m: cores[i * width:(i + 1) * width] for i, m in enumerate(models)}


def start_config(stack: ExitStack, config: str, models: list[str], out: Path, args, tokenizer) -> dict[str, tuple]:
    """Each model's (server, key) under `config`; the node's directory is fresh."""
    cores = sorted(os.sched_getaffinity(0))
    if config in ("packrat-node", "stock"):
        handler = "packrat" if config == "packrat-node" else "stock"
        served = start_server(stack, out / config, models, handler, args, tokenizer, True, cores)
        return {m: served for m in models}
    blocks = static_blocks(models, cores) if config == "static-split" else {m: cores for m in models}
    return {m: start_server(stack, out / config / m, [m], "packrat", args, tokenizer, False, blocks[m])
            for m in models}


# ---- load and statistics ------------------------------------------------------------------------

def load_models(served: dict[str, tuple], phases: list[Phase], payloads: dict, out: Path) -> dict:
    """One locust process per model running its users of each phase: {model: (launch time, records)}."""
    from packrat.bench.users import logged_load

    total = sum(p.seconds for p in phases)
    launched = time.time()

    def one(model: str):
        server, token = served[model]
        steps = {STEP_USERS.name: ",".join(str(p.users[model]) for p in phases),
                 STEP_SECONDS.name: ",".join(f"{p.seconds:g}" for p in phases)}
        return logged_load(server.inference_url, model, max(p.users[model] for p in phases), total, out / model,
                           out / f"requests-{model}.log", payload=payloads[model], token=token, shape="step",
                           env=steps, timeout_s=60)

    with ThreadPoolExecutor(len(served)) as pool:
        return {model: (launched, records) for model, records in zip(served, pool.map(one, served))}


# ---- the node over time -------------------------------------------------------------------------

def node_watch(root: Path):
    """The node's state read every second: models' cores (`samples`), slowdowns (`plans`), the last `state`."""
    from packrat.bench.harness import Periodic

    class NodeWatch(Periodic):
        def __init__(self):
            super().__init__(1.0, "node-watch")
            self.samples, self.plans, self.state = [], [], {}

        def tick(self) -> None:
            from packrat.serving.node import read_state

            state = read_state(root)
            if state is None:
                return
            self.state = state
            names = state.get("target", {}).get("names", {})
            step = state["steps"][state["step"]] if state.get("steps") else {}
            self.samples.append((time.time(), {names.get(k, k): (cores, locked) for k, (cores, locked) in step.items()}))
            shares = (state.get("target", {}).get("plan") or {}).get("models", {})
            self.plans.append((time.time(), {names.get(k, k): s.get("slowdown") for k, s in shares.items()}))

    return NodeWatch()


def plot_cores(samples: list, phases: list[Phase], path: Path) -> Path:
    """Which model runs on each core over time: a row per core, a band per model (turns split the row).
    `samples`: [(t, {model: (cores, in_turns)})], about a second apart."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = sorted({m for _, shares in samples for m in shares})
    colour = {m: f"C{i}" for i, m in enumerate(models)}
    cores = sorted({c for _, shares in samples for cs, _ in shares.values() for c in cs})
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.8 * len(cores)))
    for (t, shares), (t_next, _) in zip(samples, samples[1:]):
        for row, core in enumerate(cores):
            holders = [m for m in models if m in shares and core in shares[m][0]]
            for k, model in enumerate(holders):
                height = 0.8 / len(holders)
                ax.broken_barh([(t, t_next - t)], (row - 0.4 + k * height, height), color=colour[model], linewidth=0)
    start = 1.0
    for phase in phases:
        ax.axvline(start, color="0.3", linewidth=0.8)
        ax.text(start + 1, len(cores) - 0.45, phase.name, va="bottom", fontsize=8)
        start += phase.seconds
    ax.set_yticks(range(len(cores)), [f"core {c}" for c in cores])
    ax.set_ylim(-0.5, len(cores) - 0.5 + 0.35)
    ax.set_xlabel("seconds (a core split between models: they take turns on it, of up to turn_ms each)")
    ax.set_title("packrat-node: the models on each core as the load shifts")
    ax.legend(handles=[matplotlib.patches.Patch(color=colour[m], label=m) for m in models],
              loc="upper center", bbox_to_anchor=(0.5, -0.35 if len(cores) < 3 else -0.2), ncol=len(models),
              fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# ---- runs ---------------------------------------------------------------------------------------

def payloads_for(models: list[str], out: Path) -> tuple[dict, Path | None]:
    from packrat.codec.payloads import build_payload

    return {m: build_payload(m) for m in models}, bert_tokenizer(models, out)


def measure_alone(models: list[str], phases: list[Phase], args, out: Path, payloads, tokenizer) -> dict:
    """Each model in turn through `phases` alone on a packrat server: one summary, as of one configuration."""
    runs = {}
    for model in models:
        with ExitStack() as stack:
            served = start_config(stack, "per-model", [model], out, args, tokenizer)
            runs.update(load_models(served, phases, payloads, out / model))
    return summarise(phases, runs)


def measure_config(config: str, models: list[str], phases: list[Phase], args, out: Path, payloads, tokenizer,
                   plot: Path) -> tuple[dict, dict]:
    """One configuration through `phases`: its summary and, for packrat-node, its moves and cores (`plot`)."""
    from packrat.serving.node import node_dir
    from packrat.settings import NODE_DIR_ENV

    node_base = (out / config / "node").resolve()
    os.environ[NODE_DIR_ENV.name] = str(node_base)  # a fresh node for this configuration's servers
    with ExitStack() as stack:
        served = start_config(stack, config, models, out, args, tokenizer)
        watch = stack.enter_context(node_watch(node_dir(sorted(os.sched_getaffinity(0)), node_base)))
        runs = load_models(served, phases, payloads, out / config)
    if config != "packrat-node":
        return summarise(phases, runs), {}
    launched = next(iter(runs.values()))[0]
    cores = [(round(t - launched, 1), s) for t, s in watch.samples]
    return summarise(phases, runs, watch.plans), {"moves": watch.state.get("moves", []), "cores_over_time": cores,
                                                   "cores_plot": str(plot_cores(cores, phases, plot))}


def run_part(part: str, models: list[str], phases: list[Phase], args, out: Path) -> dict:
    """alone and every configuration in rotated rounds; each round's figures and their summary."""
    payloads, tokenizer = payloads_for(models, out)
    counts = sorted({u for p in phases for u in p.users.values() if u > 0})
    alone = [Phase("warm-up", dict.fromkeys(models, max(counts)), 10.0, 10.0, measured=False)] + \
            [Phase(alone_phase(u), dict.fromkeys(models, u), args.alone_s, 0.0) for u in counts]
    rounds = []
    for r, order in enumerate(schedule(args.configs, args.rounds), 1):
        configs, node = {}, {}
        for item in order:
            print(f"-- {part}, round {r} of {args.rounds}: {item}", flush=True)
            if item == "alone":
                configs[item] = measure_alone(models, alone, args, out / f"round{r}" / "alone", payloads, tokenizer)
            else:
                configs[item], found = measure_config(item, models, phases, args, out / f"round{r}", payloads,
                                                      tokenizer, out / f"cores-{part}-round{r}.png")
                node.update(found)
            print("   " + "; ".join(f"{phase}: " + ", ".join(f"{m} {s['rps']:.1f} req/s"
                                                        for m, s in body["models"].items())
                                    for phase, body in configs[item]["phases"].items()), flush=True)
        rounds.append({"round": r, "order": order, **normalised(configs), "node": node})
        write_json(out / "rounds-so-far.json", rounds)  # a later round's crash keeps these
    results = {"part": part, "models": models, "rounds": args.rounds,
               "phases": [{"name": p.name, "users": p.users, "seconds": p.seconds, "settle_s": p.settle_s}
                          for p in phases],
               "summary": over_all_rounds(rounds), "per_round": rounds}
    print(report(results), flush=True)
    return results


def report(results: dict) -> str:
    """A part's markdown: medians per configuration, phase and model; the node's leads; failures; rounds."""
    summary, n = results["summary"], results["rounds"]
    rows = []
    for config, body in summary["configs"].items():
        for phase, figures in body["phases"].items():
            for model, s in figures["models"].items():
                rows.append([config, phase, model, s["users"], f"{s['failures']} of {s['requests']}",
                             *(median_text(s.get(key), digits) for key, digits in CELLS)])
            if figures.get("sum_of_alone"):
                rows.append([config, phase, "sum / worst", "", "", "", "", "", median_text(figures["sum_of_alone"], 2),
                             median_text(figures["worst_slowdown"], 2), ""])
    parts = [f"### {results['part']}: medians over {n} round(s) (min–max)",
             markdown_table(["config", "phase", "model", "users", "failed", "p50 ms", "p99 ms", "req/s", "of alone",
                             "slowdown", "expected slowdown"], rows)]
    others = list(summary["leads"])
    if others:
        rows = []
        for phase, body in summary["configs"][LEAD]["phases"].items():
            rows += [[phase, model, *(median_text(summary["leads"][o][phase]["models"][model], 2) for o in others)]
                     for model in body["models"]]
            rows += [[phase, what, *(median_text(summary["leads"][o][phase][key], 2) for o in others)]
                     for what, key in (("worst model", "worst"), ("sum", "sum"))]
        parts += [f"{LEAD}'s lead, of alone over the other's (each round's ratio; medians, min–max):",
                  markdown_table(["phase", "model", *(f"/ {o}" for o in others)], rows)]
    parts += [f"failed requests over the {n} round(s): " + ", ".join(
        f"{c} {b['failed_requests']} of {b['requests']}" for c, b in summary["configs"].items())]
    lines = []
    for r in results["per_round"]:
        moves = "; ".join(f"{m['reason']} ({fmt_num(m['seconds'], 2)} s)" for m in r["node"].get("moves", []))
        lines.append(f"round {r['round']}: {', '.join(r['order'])}" + (f"; node moves: {moves}" if moves else ""))
    return "\n\n".join(parts + ["\n".join(lines)])


def run(args) -> int:
    """The parts asked for, written to OUT/multi_model.json and OUT/multi_model.md."""
    out = args.out.resolve()
    results = {}
    if args.part in ("targets", "both"):
        phases = target_phases(args.pair, args.users, args.seconds, args.settle_s)
        results["targets"] = run_part("targets", args.pair, phases, args, out / "targets")
    if args.part in ("mix", "both"):
        phases = mix_phases(args.mix, args.users, args.light_users, args.phase_s, args.settle_s)
        results["mix"] = run_part("mix", args.mix, phases, args, out / "mix")
    write_json(out / "multi_model.json", results)
    (out / "multi_model.md").write_text("\n\n".join(report(part) for part in results.values()) + "\n")
    print(f"wrote {out / 'multi_model.json'} and {out / 'multi_model.md'}")
    return 0
