"""Pool reconfiguration under continuous load, without TorchServe: starts a fat ⟨2 threads, batch 8⟩
pool, streams batches of 8 raw requests in a thread, switches fat → 2×⟨1, 4⟩ → fat → 2×⟨1, 4⟩ and prints each switch time,
then the median and worst batch latency. The first two switches start new instances (the later ones reuse
parked ones): with GRAPH_MODE script each traces, with compile each loads the compiled package (built first if
this machine's cache lacks it).

    .venv/bin/python benchmarks/switch_bench.py [MODEL] [WARMUP_NICE] [GRAPH_MODE]
                                                (defaults: resnet50 10 compile; needs 2 cores)
"""
import threading
import time

from packrat.bench.harness import pool_requests, positional_args
from packrat.bench.rounds import elapsed_ms


def main() -> None:
    model, nice, mode = positional_args(__doc__, ("model", str, "resnet50"), ("warmup_nice", int, 10),
                                        ("graph_mode", str, "compile"))
    from packrat.models.zoo import resolve
    from packrat.serving.pool.api import InstanceConfig, ModelConfig
    from packrat.serving.pool.instance_pool import InstancePool

    fat = [InstanceConfig(2, 8, (0, 1), 8)]
    split = [InstanceConfig(1, 4, (0,), 8), InstanceConfig(1, 4, (1,), 8)]
    requests = pool_requests(resolve(model), 8)
    t0 = time.time()
    pool = InstancePool(ModelConfig(model, graph_mode=mode), fat)
    print("start", round(time.time() - t0, 2))
    stop = threading.Event()
    latencies: list[float] = []  # ms per batch

    def stream():
        while not stop.is_set():
            latencies.append(elapsed_ms(lambda: pool.infer(requests)))

    streamer = threading.Thread(target=stream)
    streamer.start()
    time.sleep(3)
    for target in (split, fat, split, fat):
        t0 = time.time()
        switched = pool.reconfigure(target, warmup_nice=nice)
        print("switch", round(time.time() - t0, 2), switched)
        time.sleep(3)
    stop.set()
    streamer.join()
    pool.close()
    latencies.sort()
    print("mode", pool.mode, "median batch ms", latencies[len(latencies) // 2], "max", latencies[-1])


if __name__ == "__main__":
    main()
