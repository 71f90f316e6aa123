"""Does the IOS runtime give each group its own cores? Times one 1-thread group alone,
two 1-thread groups at once on cores 0 and 1, one 2-thread group, and two unmanaged
Python threads; then lists the process's threads by CPU affinity.

    .venv/bin/python benchmarks/ios_isolation.py      (needs at least 2 usable cores)
"""
import os
import sys
import threading
from pathlib import Path

import torch

from ios_scheduler.runtime import WorkerSet

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: benchmarks.common
from benchmarks.common import doc_parser, median_ms

doc_parser(__doc__).parse_args()  # no options: --help only
torch.set_num_threads(2)
conv = torch.nn.Conv2d(64, 64, 3, padding=1).eval()
x = torch.randn(4, 64, 56, 56)


def work():
    with torch.inference_mode():
        for _ in range(3):
            conv(x)


def plain_pair():
    """Two plain threads, each with the process default of 2 intra-op threads."""
    threads = [threading.Thread(target=work) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def med(fn) -> float:
    return median_ms(fn, 9, warmup=1)


workers = WorkerSet([0, 1])
alone = med(lambda: workers.run([work], [1]))
pair = med(lambda: workers.run([work, work], [1, 1]))
both = med(lambda: workers.run([work], [2]))
unmanaged = med(plain_pair)
tasks = {}
for tid in os.listdir("/proc/self/task"):
    affinity = tuple(sorted(os.sched_getaffinity(int(tid))))
    tasks[affinity] = tasks.get(affinity, 0) + 1
print(f"one group, 1 thread, core 0:        {alone:.1f} ms")
print(f"two groups, 1 thread each, cores 0|1: {pair:.1f} ms  (ratio to one: {pair / alone:.2f})")
print(f"one group, 2 threads, cores 0-1:     {both:.1f} ms")
print(f"two unmanaged threads (2 threads each): {unmanaged:.1f} ms")
print("threads by affinity:", tasks)
workers.close()
