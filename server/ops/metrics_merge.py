"""One Prometheus exposition for a front and its workers, each sample labelled by process.

Why fetch-and-merge rather than prometheus-client's multiprocess mode: the session metrics
are read from live session objects when scraped (custom collectors), which multiprocess
mode cannot do (it only aggregates the library's own metric types through files), and its
files are shared state a crashed worker leaves behind. Here each worker serves its own
``/metrics`` over its Unix socket; the front reads them all at scrape time, adds a
``worker`` label (``"0"``, ``"1"``, ... and ``"front"`` for its own) and writes every family
once, with one HELP and TYPE line. A worker that does not answer is missing from that
scrape, and ``cosyrtc_worker_up`` says so.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

WORKER_LABEL = "worker"
FRONT = "front"


class _Families(Collector):
    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


def _labelled(family: Metric, worker: str, merged: dict[str, Metric]) -> None:
    target = merged.get(family.name)
    if target is None:
        target = merged[family.name] = Metric(
            family.name, family.documentation, family.type, family.unit
        )
    target.samples.extend(
        Sample(s.name, {**s.labels, WORKER_LABEL: worker}, s.value, s.timestamp, s.exemplar)
        for s in family.samples
    )


def merge_expositions(workers: Mapping[str, str | None], own: Collector) -> bytes:
    """The front's exposition: ``workers`` maps a label to its text (None: no answer).

    ``own`` is the front's registry, read here: this runs in a thread, off the event loop.
    """
    merged: dict[str, Metric] = {}
    up = GaugeMetricFamily(
        "cosyrtc_worker_up",
        "1 when the worker process answered this scrape, else 0.",
        labels=[WORKER_LABEL],
    )
    for worker, text in workers.items():
        up.add_metric([worker], 0.0 if text is None else 1.0)
        for family in text_string_to_metric_families(text or ""):
            _labelled(family, worker, merged)
    for family in own.collect():
        _labelled(family, FRONT, merged)
    return generate_latest(_Families([*merged.values(), up]))
