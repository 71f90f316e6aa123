"""Measuring packrat: load against a pool or a server, interleaved rounds, faults, result files.

The stage above serving and deploy, below the commands (`packrat bench`, `packrat demo`); the
benchmarks and tests use it too. rounds.py (interleaved rounds, the clock), pool.py (the pool
alone), server.py (stock vs fat vs plan through TorchServe and locust), step.py (a step load with
reconfiguration), faults.py (pool instances killed under a server), users.py (locust users per
run), results.py (JSON result files), payloads.py and demo_tokenizers.py (the bodies load tests
send), demo.py (what the demo chooses and says), ray_local.py (a Ray cluster of pinned nodes on
one machine)."""
