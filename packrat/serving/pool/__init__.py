"""The instance pool: one pinned process per planned instance, fed request bytes through shared memory.

api.py (what callers hand it and get back), instance_pool.py (InstancePool), dispatch.py (who runs
what), supervisor.py (lifecycles, respawns, the watchdog), instance.py (one process's handle and
transport), child.py (the instance process itself: `python -m packrat.serving.pool FD`), stages.py
(where a sub-batch's time goes, stage by stage).
"""
