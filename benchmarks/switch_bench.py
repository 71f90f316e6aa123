"""Pool reconfiguration under continuous load, without TorchServe: starts a fat ⟨2 threads, batch 8⟩
pool, streams batches of 8 raw requests in a thread, switches fat → 2×⟨1, 4⟩ → fat → 2×⟨1, 4⟩ and prints each switch time,
then the median and worst batch latency. The first two switches start new instances (the later ones reuse
parked ones): with GRAPH_MODE script each traces, with compile each loads the compiled package (built first if
this machine's cache lacks it).

    .venv/bin/python benchmarks/switch_bench.py [MODEL] [WARMUP_NICE] [GRAPH_MODE]
                                                (defaults: resnet50 10 compile; needs 2 cores)
"""
import time, threading, sys
from packrat.serving.pool.instance_pool import InstancePool
from packrat.serving.pool.api import InstanceConfig, ModelConfig, Request
model = sys.argv[1] if len(sys.argv) > 1 else "resnet50"
fat = [InstanceConfig(2, 8, (0, 1), 8)]
split = [InstanceConfig(1, 4, (0,), 8), InstanceConfig(1, 4, (1,), 8)]
from packrat.models.zoo import resolve
x = [Request(s.numpy().tobytes(), "application/octet-stream") for s in resolve(model).example_input(8)]
mode = sys.argv[3] if len(sys.argv) > 3 else "compile"
t0 = time.time(); pool = InstancePool(ModelConfig(model, graph_mode=mode), fat); print("start", round(time.time() - t0, 2))
stop = threading.Event(); lat = []
def stream():
    while not stop.is_set():
        t = time.perf_counter(); pool.infer(x); lat.append((time.time(), (time.perf_counter() - t) * 1e3))
th = threading.Thread(target=stream); th.start()
time.sleep(3)
nice = int(sys.argv[2]) if len(sys.argv) > 2 else 10
for target in (split, fat, split, fat):
    t0 = time.time(); r = pool.reconfigure(target, warmup_nice=nice); print("switch", round(time.time() - t0, 2), r); time.sleep(3)
stop.set(); th.join(); pool.close()
print("mode", pool.mode, "median batch ms", sorted(l for _, l in lat)[len(lat)//2], "max", max(l for _, l in lat))
