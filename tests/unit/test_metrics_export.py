"""``/metrics`` by default: statistics figures as gauges, the ports ``temper up`` gives each
service, and the shipped Prometheus scrape config and Grafana dashboard naming only
what the services really export."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from protocol.messages import (
    ChatMessage,
    Rollout,
    ScoredRollout,
    ScoreStatus,
    Segment,
    ServiceState,
    ServiceStatus,
    StackStatus,
    Task,
)
from protocol.packed import pack_f32, pack_i32, pack_u8
from services import registry
from services.cli import build_parser
from services.cli.common import CliError
from services.cli.stack import metrics_ports as up_metrics_ports
from services.cli.status_view import status_lines
from services.control.service import ControlService, ControlSettings
from services.engines.torch.engine import TorchEngine
from services.generator.service import GeneratorService
from services.generator.settings import GeneratorSettings
from services.learner.service import LearnerService
from services.learner.settings import LearnerSettings
from services.learner.trainer import Trainer, TrainerConfig
from services.replay.service import ReplayService, ReplaySettings
from services.runtime.metrics import ServiceMetrics, figure_metric
from services.runtime.service import Service
from services.runtime.settings import RuntimeSettings
from services.validator.service import ValidatorService
from services.validator.settings import ValidatorSettings

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD: dict[str, Any] = json.loads((ROOT / "deploy" / "grafana" / "temper.json").read_text())
SCRAPE: dict[str, Any] = yaml.safe_load(
    (ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text()
)
COMPOSE: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
METRIC = re.compile(r"\btemper_\w+")
#: Sample names per metric type, beside the family's own name.
SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_sum", "_count"),
    "summary": ("_sum", "_count"),
    "gauge": ("",),
}


def exported(metrics: ServiceMetrics) -> set[str]:
    """The sample names a scrape may show, with or without samples yet (a labelled counter
    nobody touched has none)."""
    names: set[str] = set()
    for registry_ in (metrics.registry, metrics.figures):
        for family in registry_.collect():
            names.update(family.name + suffix for suffix in SUFFIXES[family.type])
    return names


def expressions() -> list[str]:
    return [target["expr"] for panel in DASHBOARD["panels"] for target in panel["targets"]]


# ---------------------------------------------------------------- statistics as gauges


def scrape(service: Service) -> dict[str, Any]:
    text = service.metrics.render().decode()
    return {family.name: family for family in text_string_to_metric_families(text)}


def test_statistics_figures_are_gauges_named_after_the_service() -> None:
    service = Service(RuntimeSettings())
    service.metrics.received.labels(source="s").inc(3)
    families = scrape(service)
    assert families["temper_service_in_flight"].type == "gauge"
    assert families["temper_service_uptime_s"].samples[0].value > 0
    # The runtime's counters are in Prometheus already: not again as figures.
    assert "received" in service.statistics()
    assert "temper_service_received" not in families
    assert families["temper_received"].samples[0].value == 3


def test_dotted_figures_become_one_gauge_with_a_domain_label() -> None:
    assert figure_metric("replay", "held") == ("temper_replay_held", {})
    assert figure_metric("learner", "reward.doc-qa") == (
        "temper_learner_reward",
        {"domain": "doc-qa"},
    )
    assert figure_metric("validator", "domain.arith.pass_rate") == (
        "temper_validator_domain_pass_rate",
        {"domain": "arith"},
    )
    assert figure_metric("my-svc", "time_a b_s") == ("temper_my_svc_time_a_b_s", {})


class _Broken(Service):
    def statistics(self) -> dict[str, float]:
        raise RuntimeError("torn down")


def test_a_failing_statistics_leaves_the_runtime_metrics() -> None:
    families = scrape(_Broken(RuntimeSettings()))
    assert "temper_up" in families
    assert not [name for name in families if name.startswith("temper_service_")]


# ---------------------------------------------------------------- ports of temper up


def test_each_service_keeps_its_port_whatever_runs() -> None:
    every = registry.metrics_ports(sorted(registry.BUILTIN))
    assert every == {
        "control": 9460,
        "generator": 9461,
        "learner": 9462,
        "replay": 9463,
        "sandbox": 9464,
        "validator": 9465,
    }
    assert registry.metrics_ports(["validator", "replay"]) == {"validator": 9465, "replay": 9463}
    assert registry.metrics_ports(["replay"], base=9100) == {"replay": 9103}
    assert registry.metrics_ports(["replay", "learner"], base=0) == {"replay": 0, "learner": 0}


def test_temper_up_options_give_ports_or_none() -> None:
    parser = build_parser()
    names = ("control", "replay")
    default = parser.parse_args(["up"])
    assert up_metrics_ports(default, names) == {"control": 9460, "replay": 9463}
    assert up_metrics_ports(parser.parse_args(["up", "--no-metrics"]), names) == {}
    free = parser.parse_args(["up", "--metrics-port-base", "0"])
    assert up_metrics_ports(free, names) == {"control": 0, "replay": 0}
    with pytest.raises(CliError):
        up_metrics_ports(parser.parse_args(["up", "--metrics-port-base", "65533"]), names)


def test_scrape_config_has_one_job_per_service_on_its_default_port() -> None:
    ports = registry.metrics_ports(sorted(registry.BUILTIN))
    jobs = {
        job["job_name"]: [t for static in job["static_configs"] for t in static["targets"]]
        for job in SCRAPE["scrape_configs"]
    }
    assert jobs == {name: [f"127.0.0.1:{port}"] for name, port in ports.items()}


def test_compose_gives_each_service_the_port_temper_up_gives_it() -> None:
    services = COMPOSE["services"]
    for name, port in registry.metrics_ports(sorted(registry.BUILTIN)).items():
        assert services[name]["environment"]["TEMPER_METRICS_PORT"] == str(port), name
        assert services[name]["environment"]["TEMPER_METRICS_HOST"] == "0.0.0.0", name


def test_status_lists_each_metrics_endpoint() -> None:
    def listed(instance: str, url: str, detail: str = "") -> ServiceStatus:
        return ServiceStatus(
            service="replay",
            instance=instance,
            state=ServiceState.RUNNING,
            healthy=True,
            age_s=1.0,
            detail=detail,
            metrics_url=url,
        )

    status = StackStatus(
        services=[
            listed("r1", "http://127.0.0.1:9463/metrics", "3 held"),
            listed("r2", ""),
        ]
    )
    header, r1, r2 = status_lines("nats://x", status)[1:4]
    assert header.split()[-1] == "METRICS"
    assert r1.split()[-3:] == ["http://127.0.0.1:9463/metrics", "3", "held"]
    assert r2.split()[-1] == "-"


# ---------------------------------------------------------------- the dashboard's names


def _scored(index: int, reward: float) -> ScoredRollout:
    task = Task(id="t", domain="arithmetic", prompt=[ChatMessage(role="user", content="q")], n=2)
    completion = [22, 23, 24] if reward else [40, 41, 42]
    rollout = Rollout(
        id=f"t/{index}",
        task=task,
        sample_index=index,
        tokens=pack_i32([1, 341, 203, 317, *completion]),
        prompt_len=4,
        logprobs=pack_f32([-7.6] * 3),
        loss_mask=pack_u8([1] * 3),
        segments=[Segment(start=0, end=3, version=0)],
    )
    return ScoredRollout(id=rollout.id, rollout=rollout, reward=reward, status=ScoreStatus.SCORED)


def learner_after_a_step(model: Path, out: Path) -> LearnerService:
    learner = LearnerService(LearnerSettings(model=model, out_dir=out / "learner"))
    trainer = Trainer(model, out / "trainer", TrainerConfig())
    # What setup() and one step leave behind, without NATS: the figures they add.
    learner._trainer = trainer
    learner.last = trainer.train([_scored(0, 1.0), _scored(1, 0.0)])
    return learner


@pytest.fixture
def every_name(tiny_model: Path, tmp_path: Path) -> set[str]:
    """What the services of the dashboard export, in the state of a stack that has worked."""
    validator = ValidatorService(ValidatorSettings())
    validator.stats.record("arithmetic", ScoreStatus.SCORED, 1.0, 1.0)
    services: list[Service] = [
        ControlService(ControlSettings()),
        GeneratorService(GeneratorSettings(model=tiny_model), engine=TorchEngine(tiny_model)),
        validator,
        ReplayService(ReplaySettings()),
        learner_after_a_step(tiny_model, tmp_path),
    ]
    return set().union(*(exported(service.metrics) for service in services))


def test_every_dashboard_expression_names_metrics_the_services_export(
    every_name: set[str],
) -> None:
    for expr in expressions():
        names = set(METRIC.findall(expr))
        assert names, expr
        assert names <= every_name, (expr, sorted(names - every_name))


def test_the_dashboard_covers_what_operators_watch() -> None:
    named = {name for expr in expressions() for name in METRIC.findall(expr)}
    wanted = {
        "temper_generator_generated_tokens",
        "temper_generator_cache_hit_ratio",
        "temper_validator_seconds_bucket",
        "temper_replay_held",
        "temper_replay_leased",
        "temper_learner_step_s",
        "temper_learner_reward_mean",
        "temper_learner_staleness_mean",
        "temper_generator_weight_update_failures",
    }
    assert wanted <= named
    statuses = {v for expr in expressions() for v in re.findall(r'status="(\w+)"', expr)}
    assert statuses <= {s.value for s in ScoreStatus}
    panel_ids = [panel["id"] for panel in DASHBOARD["panels"]]
    assert len(panel_ids) == len(set(panel_ids))
