"""Measuring packrat: a harness, and the scenarios on it (`packrat bench ...`, `packrat demo`, benchmarks/).

The harness: rounds.py, harness.py, servers.py, users.py, faults.py, resources.py, results.py; every
other module is a scenario, or a part of one (docs/architecture.md lists each with what it does)."""
