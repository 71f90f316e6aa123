"""Measuring packrat: load against a pool or a server, interleaved rounds, faults, result files.

The stage above serving and deploy, below the commands (`packrat bench`, `packrat demo`); the
benchmarks and tests use it too. rounds.py (interleaved rounds, in groups that fit memory, paired
ratios, the clock), harness.py (child processes and workers that live across rounds, markdown),
pool.py (the pool alone), peers.py and oracle.py (the plan against other runtimes and against every
configuration), server.py (stock vs fat vs plan through TorchServe and locust), step.py, faults.py,
chaos.py, overload.py (loads and faults under a server), results.py (JSON result files), demo.py and
demo_tokenizers.py (the demo), ray_local.py (a Ray cluster of pinned nodes on one machine)."""
