"""Stream copies and NATS URL lists, without a server: from the settings to what nats-py
and nats-server are given."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from protocol import streams
from protocol.servers import NoServersGiven, server_list
from services.cli import build_parser, main
from services.runtime.jetstream import stream_config
from services.runtime.natscluster import NatsClusterSettings
from services.runtime.natsserver import RANDOM_PORT, _config
from services.runtime.settings import RuntimeSettings, from_env
from services.supervisor import StackSettings


@dataclass(frozen=True, kw_only=True)
class DemoSettings:
    runtime: RuntimeSettings = field(default_factory=RuntimeSettings)


def test_one_url_is_a_list_of_one() -> None:
    assert server_list("nats://127.0.0.1:4222") == ["nats://127.0.0.1:4222"]


def test_a_comma_separated_url_is_every_server_in_order() -> None:
    url = "nats://127.0.0.1:4222, nats://127.0.0.1:4223,,nats://127.0.0.1:4224 ,"
    assert server_list(url) == [
        "nats://127.0.0.1:4222",
        "nats://127.0.0.1:4223",
        "nats://127.0.0.1:4224",
    ]


@pytest.mark.parametrize("url", ["", " ", ",", " , ,"])
def test_a_url_naming_no_server_is_refused(url: str) -> None:
    with pytest.raises(NoServersGiven):
        server_list(url)


def test_streams_keep_one_copy_unless_told() -> None:
    assert {spec.replicas for spec in streams.ALL} == {1}
    assert {stream_config(spec).num_replicas for spec in streams.ALL} == {1}


def test_replicas_reach_every_stream_config() -> None:
    specs = streams.with_replicas(streams.ALL, 3)
    assert [spec.name for spec in specs] == [spec.name for spec in streams.ALL]
    assert {stream_config(spec).num_replicas for spec in specs} == {3}
    # Nothing else changes.
    assert stream_config(specs[0]).subjects == stream_config(streams.ALL[0]).subjects


def test_zero_replicas_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one replica"):
        streams.with_replicas(streams.ALL, 0)


def test_every_service_reads_the_shared_replica_setting() -> None:
    environ = {"TEMPER_STREAM_REPLICAS": "3", "TEMPER_NATS_URL": "nats://a:1,nats://b:2"}
    runtime = from_env(DemoSettings, "TEMPER_DEMO_", environ).runtime
    assert runtime.stream_replicas == 3
    assert server_list(runtime.nats_url) == ["nats://a:1", "nats://b:2"]
    assert from_env(DemoSettings, "TEMPER_DEMO_", {}).runtime.stream_replicas == 1


@pytest.mark.parametrize(
    ("settings", "replicas"),
    [
        (StackSettings(), 1),
        (StackSettings(nats_cluster=3), 3),
        (StackSettings(nats_cluster=5), 3),
        (StackSettings(nats_cluster=3, stream_replicas=2), 2),
        (StackSettings(nats_url="nats://a:1,nats://b:2,nats://c:3"), 1),
        (StackSettings(nats_url="nats://a:1,nats://b:2,nats://c:3", stream_replicas=3), 3),
    ],
)
def test_the_stack_keeps_one_copy_per_server_up_to_three(
    settings: StackSettings, replicas: int
) -> None:
    assert settings.replicas() == replicas


def test_cluster_servers_have_their_own_name_ports_and_store(tmp_path: Path) -> None:
    cluster = NatsClusterSettings.consecutive(tmp_path, 3, port=4222, route_port=6222)
    servers = cluster.servers()
    assert [s.server_name for s in servers] == ["nats-1", "nats-2", "nats-3"]
    assert [s.port for s in servers] == [4222, 4223, 4224]
    assert len({s.store_dir for s in servers}) == 3
    routes = (
        "nats-route://127.0.0.1:6222",
        "nats-route://127.0.0.1:6223",
        "nats-route://127.0.0.1:6224",
    )
    for server, route_port in zip(servers, (6222, 6223, 6224), strict=True):
        assert server.cluster is not None
        assert (server.cluster.name, server.cluster.port) == ("temper", route_port)
        assert server.cluster.routes == routes


def test_a_cluster_server_config_names_the_cluster_and_its_routes(tmp_path: Path) -> None:
    server = NatsClusterSettings.consecutive(tmp_path, 3, port=4222, route_port=6222).servers()[1]
    text = _config(server, tmp_path / "ports")
    assert 'server_name: "nats-2"' in text
    assert 'listen: "127.0.0.1:6223"' in text
    assert '"nats-route://127.0.0.1:6222", "nats-route://127.0.0.1:6223"' in text
    assert str(tmp_path / "nats-2" / "jetstream") in text


def test_a_lone_server_config_has_no_cluster(tmp_path: Path) -> None:
    server = NatsClusterSettings.consecutive(tmp_path, 1, port=4222, route_port=6222).servers()[0]
    assert "cluster" not in _config(replace(server, cluster=None), tmp_path)


def test_free_route_ports_and_random_client_ports(tmp_path: Path) -> None:
    cluster = NatsClusterSettings.consecutive(tmp_path, 3, port=RANDOM_PORT, route_port=0)
    assert cluster.ports == (RANDOM_PORT,) * 3
    assert len(set(cluster.route_ports)) == 3 and all(p > 0 for p in cluster.route_ports)


def test_a_route_port_per_server_is_required(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="one route port per server"):
        NatsClusterSettings(store_dir=tmp_path, ports=(1, 2, 3), route_ports=(4, 5))


def test_up_takes_a_cluster_and_its_replicas() -> None:
    args = build_parser().parse_args(["up", "--nats-cluster", "3", "--nats-route-port", "7000"])
    assert (args.nats_cluster, args.nats_route_port, args.stream_replicas) == (3, 7000, None)
    assert build_parser().parse_args(["up"]).nats_cluster == 1


@pytest.mark.parametrize("argv", [["--nats-cluster", "0"], ["--stream-replicas", "-1"]])
def test_up_refuses_fewer_than_one(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["up", *argv])
    assert caught.value.code == 2


def test_up_refuses_more_copies_than_servers(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["up", "--service", "control", "--stream-replicas", "3"]) == 2
    assert "--stream-replicas 3 needs as many servers" in capsys.readouterr().err
