"""Work-conserving dispatch vs whole batches: the packrat handler (planned instances) in
TorchServe's asynchronous worker mode (requests reach the pool as they arrive), with an idle
instance starting at once (gather 0 ms) or waiting up to 30 ms for its planned share (the
default), against the same handler in TorchServe's ordinary mode (a batch is gathered by
TorchServe within 50 ms, split, run and answered whole before the next; packrat's default again
since issue 16), with stock TorchServe beside them. Closed loop, B users, JPEG payloads.

    .venv/bin/python benchmarks/dispatch_modes.py [MODEL] [B] [DURATION] [OUT]
"""
import sys
from pathlib import Path

from packrat.cli import compare

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: benchmarks.common
from benchmarks.common import positional_args

model, batch, duration, out = positional_args(__doc__, ("model", str, "resnet50"), ("batch", int, 4),
                                              ("duration", float, 30.0), ("out", Path, Path("out/dispatch")))
configs = (("stock", "stock", "auto"),
           ("whole-batches", "packrat", "auto", {"async_worker": False}),
           ("gather-0ms", "packrat", "auto", {"async_worker": True, "gather_ms": 0}),
           ("gather-30ms", "packrat", "auto", {"async_worker": True, "gather_ms": 30}))
runs = compare.server_bench(model, batch, Path("profiles") / f"{model}.csv", out, duration_s=duration, configs=configs,
                          max_batch_delay_ms=50)
print(f"\n{model}, B={batch}, {batch} users, {duration:.0f} s each (locust on the same cores)")
print(compare.format_server_results(runs))
