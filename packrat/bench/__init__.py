"""Measuring packrat: a harness, and the scenarios on it (`packrat bench ...`, `packrat demo`, benchmarks/).

The harness: rounds.py (interleaved rounds, the clock, medians, paired ratios), harness.py (command
lines, pinned child processes, workers across rounds, threads that tick), servers.py (archives,
TorchServe and the KServe server started, a started one as a Target, bodies, counters, health
probes), users.py (users patterns, a load logged, users of an in-process engine, their requests
counted), faults.py (instances killed, the machine slowed), resources.py (a server's memory, open
files, /dev/shm and CPU), results.py (JSON files, markdown tables, verdicts).

The scenarios: server.py and pool.py (`packrat bench`: through TorchServe, the pool alone),
peers.py (with peer_runners.py, peers_report.py), oracle.py (with oracle_configs.py,
oracle_report.py), chaos.py (with chaos_faults.py), overload.py (with overload_report.py, soak.py),
multi_model_run.py (with multi_model.py), plain_http.py (with plain_server.py, ceiling.py,
load_client.py), demo.py (`packrat demo`); node_chaos.py, instance.py and correction.py (the
benchmarks/ scripts')."""
