"""Measuring packrat: a harness, and the scenarios (`packrat bench ...`, `packrat demo`, benchmarks/) on it.

The harness: rounds.py (interleaved rounds, the clock, medians and paired ratios), harness.py
(command lines, pinned child processes, workers across rounds, threads that tick), servers.py (a
server started on free ports as a Target, its bodies, status counters and health probes), users.py
(users patterns, a load of them logged, their requests counted), faults.py (instances killed, the
machine slowed), resources.py (a server's memory, open files, /dev/shm and CPU), results.py (JSON
files, markdown tables, verdicts).

The scenarios: server.py, pool.py, step.py, memory.py (`packrat bench`), peers.py (with
peer_runners.py, peers_report.py), oracle.py (with oracle_configs.py, oracle_report.py), chaos.py
(with chaos_faults.py), overload.py (with overload_report.py, soak.py), multi_model_run.py (with
multi_model.py), plain_http.py (with plain_server.py), demo.py (`packrat demo`); node_chaos.py,
instance.py and correction.py (benchmarks/ scripts')."""
