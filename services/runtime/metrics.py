"""Prometheus metrics, one registry per service instance (no process-global registry)."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import Metric

_LATENCY_BUCKETS = (
    *(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5),
    *(1, 2.5, 5, 10, 30, 60, 300),
)


class ServiceMetrics:
    """The runtime's own counters; services add theirs on ``registry``."""

    def __init__(self, service: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        labels = ["source"]
        self.received = Counter(
            "temper_received", "Messages received", labels, registry=self.registry
        )
        self.acked = Counter(
            "temper_acked", "Messages acked after handling", labels, registry=self.registry
        )
        self.failed = Counter(
            "temper_failed",
            "Handler failures (message handed back)",
            labels,
            registry=self.registry,
        )
        self.dead_lettered = Counter(
            "temper_dead_lettered",
            "Messages moved to the dead-letter stream",
            labels,
            registry=self.registry,
        )
        self.bad_input = Counter(
            "temper_bad_input",
            "Input rejected before handling",
            ["source", "code"],
            registry=self.registry,
        )
        self.redelivered = Counter(
            "temper_redelivered", "Messages seen more than once", labels, registry=self.registry
        )
        self.handled_back = Counter(
            "temper_handed_back",
            "In-flight messages handed back on shutdown",
            labels,
            registry=self.registry,
        )
        self.latency = Histogram(
            "temper_handler_seconds",
            "Handler latency",
            labels,
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "temper_in_flight", "Messages being handled", labels, registry=self.registry
        )
        self.up = Gauge(
            "temper_up", "1 while the service runs", ["service"], registry=self.registry
        )
        self.up.labels(service=service).set(0)
        self.service = service
        #: The service's ``statistics()`` as gauges.  A registry of their own: those figures
        #: include totals read from ``registry``, so a collector there would read itself.
        self.figures = CollectorRegistry(auto_describe=False)

    def export_figures(self, read: Callable[[], Mapping[str, float]]) -> None:
        """Serve what ``read`` returns at each scrape as ``temper_<service>_<figure>`` gauges."""
        self.figures.register(Figures(self.service, read))

    def render(self) -> bytes:
        return generate_latest(self.registry) + generate_latest(self.figures)


#: The label of a dotted figure's middle part: every dotted figure is per domain today
#: (the validator's ``domain.<name>.<field>``, the learner's ``reward.<domain>``).
FIGURE_LABEL = "domain"
_NOT_IN_A_NAME = re.compile(r"[^A-Za-z0-9_]")


def figure_metric(service: str, key: str) -> tuple[str, dict[str, str]]:
    """(metric name, labels) of one statistics figure.

    ``held`` -> ``temper_<service>_held``; ``reward.<domain>`` ->
    ``temper_<service>_reward{domain=...}``; ``domain.<name>.<field>`` ->
    ``temper_<service>_domain_<field>{domain=...}``.
    """
    parts = key.split(".")
    labels: dict[str, str] = {}
    if len(parts) >= 2:
        labels[FIGURE_LABEL] = ".".join(parts[1:-1] if len(parts) > 2 else parts[1:])
        parts = [parts[0], parts[-1]] if len(parts) > 2 else parts[:1]
    name = "_".join(["temper", service, *parts])
    return _NOT_IN_A_NAME.sub("_", name), labels


class Figures:
    """A collector that reads the figures when the registry is read (no copy kept)."""

    def __init__(self, service: str, read: Callable[[], Mapping[str, float]]) -> None:
        self._service = service
        self._read = read

    def collect(self) -> Iterator[Metric]:
        families: dict[str, Metric] = {}
        for key, value in sorted(self._read().items()):
            name, labels = figure_metric(self._service, key)
            family = families.get(name)
            if family is None:
                help_text = f"{self._service} statistics figure {key.split('.')[0]}"
                family = families[name] = Metric(name, help_text, "gauge")
            family.add_sample(name, labels, float(value))
        yield from families.values()


class MetricsServer:
    """A minimal asyncio HTTP endpoint for ``/metrics`` (no background thread)."""

    def __init__(self, metrics: ServiceMetrics, host: str, port: int) -> None:
        self._metrics = metrics
        self._host = host
        self._port = port
        self._server: asyncio.Server | None = None

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("metrics server not started")
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, self._host, self._port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readline(), timeout=5)
            path = request.split(b" ")[1] if request.count(b" ") >= 2 else b"/"
            if path.startswith(b"/metrics"):
                status, body, ctype = (
                    b"200 OK",
                    self._metrics.render(),
                    CONTENT_TYPE_LATEST.encode(),
                )
            else:
                status, body, ctype = b"404 Not Found", b"not found\n", b"text/plain"
            writer.write(
                b"HTTP/1.1 "
                + status
                + b"\r\nContent-Type: "
                + ctype
                + b"\r\nContent-Length: "
                + str(len(body)).encode()
                + b"\r\nConnection: close\r\n\r\n"
                + body
            )
            await writer.drain()
        except (TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
