"""packrat's figures on the KServe server's /metrics, beside KServe's own (prometheus_client's
default registry): per model, the plan, each planned instance's predicted and served latency, the
pool's health (its refusals by cause among it) and the reconfigurations. Read from the engines when
/metrics is scraped, so serving pays nothing for them."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from packrat.serving.pool.admission import CAUSES

# pool health counters, as counters: (metric, Health field, help)
HEALTH_COUNTERS = (
    ("packrat_answered_requests", "answered", "requests the pool answered"),
    ("packrat_admitted_requests", "admitted", "requests taken in: predicted to be answered within their deadline"),
    ("packrat_refused_requests", "refused", "requests answered 503: not answerable in time, the queue was full, or "
                                            "no instance could run them"),
    ("packrat_refused_late_requests", "refused_late", "of the refused: predicted to be answered past their deadline"),
    ("packrat_expired_requests", "expired", "requests answered 504: past their deadline"),
    ("packrat_requeued_requests", "requeued", "requests run again after their instance died or hung"),
    ("packrat_watchdog_kills", "watchdog_kills", "instances killed by the watchdog: a batch ran past its deadline"),
)
HEALTH_GAUGES = (
    ("packrat_instances", "instances", "instances of the plan"),
    ("packrat_instances_ready", "ready", "instances ready to run a batch"),
    ("packrat_instances_respawning", "respawning", "instances being started again after they died"),
    ("packrat_queued_requests", "queued", "requests waiting for an instance"),
    ("packrat_predicted_wait_ms", "predicted_wait_ms", "when a request arriving now would be answered, as predicted "
                                                       "(NaN: nothing served to predict from yet)"),
)
INSTANCE_LABELS = ["model", "threads", "batch", "runtime"]


class PackratCollector(Collector):
    """The figures of every packrat model that `models()` (name -> KServe model) holds now."""

    def __init__(self, models: Callable[[], dict]):
        self.models = models
        self._seen: dict[str, tuple[object, int, int]] = {}  # model -> (last record counted, switches, failures)

    def collect(self) -> Iterator:
        engines = {name: model.serving for name, model in list(self.models().items()) if hasattr(model, "serving")}
        yield from plan_metrics(engines)
        yield from health_metrics(engines)
        yield from self._reconfigurations(engines)

    def _reconfigurations(self, engines: dict) -> Iterator:
        """Switches and failed switches since the server started: the controller keeps only its last
        records, so the ones not yet counted are those after the last record counted."""
        switches = CounterMetricFamily("packrat_reconfigurations", "plan switches (reconfigurations)", labels=["model"])
        failures = CounterMetricFamily("packrat_reconfiguration_failures", "plan switches that failed",
                                       labels=["model"])
        for name, engine in engines.items():
            records = list(engine.controller.reconfigurations)
            last, count, failed = self._seen.get(name, (None, 0, 0))
            newer = records[next((i + 1 for i, r in enumerate(records) if r is last), 0):]
            count, failed = count + len(newer), failed + sum(1 for r in newer if r.error)
            self._seen[name] = (records[-1] if records else last, count, failed)
            switches.add_metric([name], count)
            failures.add_metric([name], failed)
        yield switches
        yield failures


def plan_metrics(engines: dict) -> Iterator:
    batch = GaugeMetricFamily("packrat_plan_batch", "the batch size the plan serves", labels=["model"])
    instances = GaugeMetricFamily("packrat_plan_instances", "instances the plan runs", labels=["model"])
    expected = GaugeMetricFamily("packrat_plan_expected_latency_ms", "the plan's expected batch latency",
                                 labels=["model"])
    predicted = GaugeMetricFamily("packrat_instance_predicted_latency_ms",
                                  "the profile's model latency of a planned instance", labels=INSTANCE_LABELS)
    served = GaugeMetricFamily("packrat_instance_served_latency_ms",
                               "the median model latency a planned instance served (its whole planned batch)",
                               labels=INSTANCE_LABELS)
    corrections = GaugeMetricFamily("packrat_corrections", "profile figures replaced by served ones",
                                    labels=["model"])
    for name, engine in engines.items():
        plan = engine.controller.plan
        batch.add_metric([name], plan.batch)
        instances.add_metric([name], len(plan.instances))
        if plan.expected_latency_ms is not None:
            expected.add_metric([name], plan.expected_latency_ms)
        figures = engine.corrector.status(plan, engine.pool.served_figures())
        corrections.add_metric([name], len(figures["corrections"]))
        for labels, row in _per_point(name, figures["instances"]).items():
            if row["predicted_ms"] is not None:
                predicted.add_metric(labels, row["predicted_ms"])
            if row["served_ms"] is not None:
                served.add_metric(labels, row["served_ms"])
    yield from (batch, instances, expected, predicted, served, corrections)


def _per_point(name: str, rows: list[dict]) -> dict[tuple, dict]:
    """One row per ⟨threads, batch, runtime⟩: identical instances share their figures."""
    return {(name, str(r["threads"]), str(r["batch"]), r["runtime"]): r for r in rows}


def health_metrics(engines: dict) -> Iterator:
    counters = {metric: CounterMetricFamily(metric, text, labels=["model"]) for metric, _, text in HEALTH_COUNTERS}
    gauges = {metric: GaugeMetricFamily(metric, text, labels=["model"]) for metric, _, text in HEALTH_GAUGES}
    respawns = CounterMetricFamily("packrat_respawns", "instances started again after they died", labels=["model"])
    refusals = CounterMetricFamily("packrat_refusals", "requests not admitted or not run, by cause: late (predicted "
                                   "past their deadline), queue_full, expired_before (504: their deadline passed "
                                   "before they reached the pool), unavailable (no instance could run them)",
                                   labels=["model", "cause"])
    for name, engine in engines.items():
        health = engine.pool.health()
        for cause in CAUSES:
            refusals.add_metric([name, cause], health.refusals.get(cause, 0))
        for metric, field, _ in HEALTH_COUNTERS:
            counters[metric].add_metric([name], getattr(health, field))
        for metric, field, _ in HEALTH_GAUGES:
            value = getattr(health, field)
            gauges[metric].add_metric([name], float("nan") if value is None else value)
        respawns.add_metric([name], engine.pool.respawns)
    yield from counters.values()
    yield from gauges.values()
    yield respawns
    yield refusals
