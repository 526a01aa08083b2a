"""Distributed weight transport without servers: the learner's weight server, the
generator's receiver and the generator's choice between broadcast and disk, on fakes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import structlog
import torch
from safetensors.torch import save_file

from protocol import subjects
from protocol.codec import ANY, encode
from protocol.errors import ErrorCode, SubjectError
from protocol.messages import (
    ErrorReply,
    Message,
    PolicyUpdate,
    WeightFormat,
    WeightGroup,
    WeightGroupOpen,
    WeightSend,
    WeightSending,
)
from services.engines.engine import EngineError, WeightUpdateError
from services.engines.sglang.broadcast import TensorSpec
from services.generator.service import GeneratorService
from services.generator.settings import GeneratorSettings
from services.generator.weight_receiver import BroadcastEngine, WeightReceiver
from services.learner.broadcast import (
    BroadcastSettings,
    WeightServer,
    make_weight_server,
    read_snapshot,
)
from services.learner.service import LearnerService
from services.learner.settings import LearnerSettings, WeightSettings
from services.learner.trainer import Exported
from services.model.weights import WEIGHTS_FILE, directory_digest
from services.runtime.errors import RequestRejected
from services.runtime.responder import Request

LOG = structlog.get_logger()


# ---------------------------------------------------------------- fakes


@dataclass
class FakeSender:
    fail_broadcast: bool = False
    connected: bool = False
    closed: bool = False
    sent: list[list[str]] = field(default_factory=list)

    def connect(self) -> None:
        self.connected = True

    def broadcast(self, named_tensors: Sequence[tuple[str, Any]]) -> None:
        if self.fail_broadcast:
            raise RuntimeError("Connection reset by peer")
        self.sent.append([name for name, _ in named_tensors])

    def close(self) -> None:
        self.closed = True


@dataclass
class FakeMsg:
    reply: str = "_INBOX.1"
    replies: list[Message] = field(default_factory=list)

    async def respond(self, data: bytes) -> None:
        self.replies.append(ANY.decode(data))


def request() -> tuple[Request, FakeMsg]:
    msg = FakeMsg()
    return Request(subject="s", headers={}, trace_id="", msg=cast(Any, msg)), msg


def published(tmp_path: Path, version: int, scale: float = 1.0) -> Exported:
    path = tmp_path / f"v{version}"
    path.mkdir()
    tensors = {
        "model.norm.weight": torch.full((4,), scale),
        "lm_head.weight": torch.arange(6, dtype=torch.float32).reshape(2, 3) * scale,
    }
    save_file(tensors, path / WEIGHTS_FILE, metadata={"format": "pt"})
    return Exported(version=version, path=path, digest=directory_digest(path))


def server(senders: list[FakeSender] | None = None, max_groups: int = 16) -> WeightServer:
    made = senders if senders is not None else []

    def factory(offer: WeightGroup, timeout_s: float) -> FakeSender:
        sender = FakeSender()
        made.append(sender)
        return sender

    settings = BroadcastSettings(timeout_s=2.0, max_groups=max_groups)
    return WeightServer(settings, "learner-0", LOG, factory)


async def offered(weights: WeightServer, exported: Exported, *, announce: bool = True) -> None:
    plain = PolicyUpdate(version=exported.version, uri=str(exported.path), digest=exported.digest)
    await weights.offer(exported, plain)
    if announce:
        weights.announced(exported.version)


async def open_group(weights: WeightServer, instance: str = "gen-0", servers: int = 2) -> str:
    ctx, msg = request()
    await weights._on_request(WeightGroupOpen(instance=instance, servers=servers), ctx)
    [offer] = msg.replies
    assert isinstance(offer, WeightGroup)
    return offer.group


# ---------------------------------------------------------------- subjects and settings


def test_the_weight_subject_names_one_learner_instance() -> None:
    assert subjects.policy_weights("learner-0") == "temper.v1.policy.weights.learner-0"
    with pytest.raises(SubjectError):
        subjects.policy_weights("a.b")


def test_a_host_name_with_dots_still_makes_a_weight_subject() -> None:
    weights = WeightServer(BroadcastSettings(), "ip-10-0-0-7.ec2.internal-4242", LOG)
    assert weights.subject == "temper.v1.policy.weights.ip-10-0-0-7-ec2-internal-4242"


async def test_the_learner_announces_a_snapshot_it_then_serves(tmp_path: Path) -> None:
    settings = LearnerSettings(
        out_dir=tmp_path / "run",
        weights=WeightSettings(weight_transport="distributed"),
        tensorboard=False,
    )
    learner = LearnerService(settings)
    learner._trainer = cast(Any, SimpleNamespace(step=3, consumed=12, settled=15))
    weights = learner.weights
    assert weights is not None
    announced: list[PolicyUpdate] = []

    async def publish(subject: str, update: PolicyUpdate, msg_id: str) -> None:
        assert weights._announced < update.version, "served only once announced"
        announced.append(update)

    learner._publish_patiently = publish  # type: ignore[method-assign]
    exported = published(tmp_path, 2)
    await learner._announce(exported)
    [update] = announced
    assert update.format is WeightFormat.TORCH_DISTRIBUTED
    assert update.uri == weights.subject
    assert update.path == str(exported.path.resolve())
    assert (update.version, update.digest, update.trained_samples) == (2, exported.digest, 12)
    assert update.settled_samples == 15
    assert weights._servable(1).version == 2


def test_the_transport_setting_is_checked() -> None:
    assert make_weight_server("disk", BroadcastSettings(), "l", LOG) is None
    assert isinstance(
        make_weight_server("distributed", BroadcastSettings(), "l", LOG), WeightServer
    )
    with pytest.raises(ValueError, match="weight_transport 'nccl'"):
        make_weight_server("nccl", BroadcastSettings(), "l", LOG)


# ---------------------------------------------------------------- the learner's weight server


async def test_the_announcement_names_the_weight_subject_and_the_directory(
    tmp_path: Path,
) -> None:
    weights = server()
    exported = published(tmp_path, 3)
    plain = PolicyUpdate(version=3, uri=str(exported.path), digest=exported.digest, step=7)
    update = await weights.offer(exported, plain)
    assert update.format is WeightFormat.TORCH_DISTRIBUTED
    assert update.uri == "temper.v1.policy.weights.learner-0"
    assert update.path == str(exported.path)
    assert (update.version, update.digest, update.step) == (3, exported.digest, 7)


def test_the_snapshot_holds_the_published_tensors_in_name_order(tmp_path: Path) -> None:
    snapshot = read_snapshot(published(tmp_path, 1, scale=2.0))
    assert [name for name, _ in snapshot.tensors] == ["lm_head.weight", "model.norm.weight"]
    assert torch.equal(snapshot.tensors[1][1], torch.full((4,), 2.0))
    specs = snapshot.specs()
    assert [(s.name, s.dtype, s.shape) for s in specs] == [
        ("lm_head.weight", "float32", [2, 3]),
        ("model.norm.weight", "float32", [4]),
    ]


async def test_a_group_is_offered_then_joined(tmp_path: Path) -> None:
    senders: list[FakeSender] = []
    weights = server(senders)
    ctx, msg = request()
    await weights._on_request(WeightGroupOpen(instance="gen-0", servers=2), ctx)
    [offer] = msg.replies
    assert isinstance(offer, WeightGroup)
    assert (offer.world_size, offer.master_address, offer.backend) == (3, "127.0.0.1", "gloo")
    assert 0 < offer.master_port < 65536
    assert senders[0].connected


async def test_a_version_is_sent_after_the_reply_over_the_group(tmp_path: Path) -> None:
    senders: list[FakeSender] = []
    weights = server(senders)
    await offered(weights, published(tmp_path, 1))
    group = await open_group(weights)
    ctx, msg = request()
    await weights._on_request(WeightSend(group=group, version=1), ctx)
    [sending] = msg.replies
    assert isinstance(sending, WeightSending)
    assert sending.version == 1
    assert [t.name for t in sending.tensors] == senders[0].sent[0]
    assert weights.broadcasts == 1


async def test_a_failed_broadcast_closes_the_group(tmp_path: Path) -> None:
    senders: list[FakeSender] = []
    weights = server(senders)
    await offered(weights, published(tmp_path, 1))
    group = await open_group(weights)
    senders[0].fail_broadcast = True
    await weights._on_request(WeightSend(group=group, version=1), request()[0])
    assert senders[0].closed
    assert weights.failures == 1
    with pytest.raises(RequestRejected) as refused:
        await weights._on_request(WeightSend(group=group, version=1), request()[0])
    assert refused.value.code is ErrorCode.VALIDATION
    assert refused.value.field == "$.group"


async def test_only_announced_versions_leave(tmp_path: Path) -> None:
    weights = server()
    group = await open_group(weights)
    with pytest.raises(RequestRejected, match="holding nothing"):
        await weights._on_request(WeightSend(group=group, version=1), request()[0])
    await offered(weights, published(tmp_path, 1))
    await offered(weights, published(tmp_path, 2), announce=False)
    # Version 2 is being announced: whoever saw its announcement gets it ...
    ctx, msg = request()
    await weights._on_request(WeightSend(group=group, version=2), ctx)
    assert cast(WeightSending, msg.replies[0]).version == 2
    # ... but it is not sent for version 1 before its announcement is out.
    with pytest.raises(RequestRejected, match="version 1 is not held here") as refused:
        await weights._on_request(WeightSend(group=group, version=1), request()[0])
    assert refused.value.code is ErrorCode.UNAVAILABLE
    weights.announced(2)
    ctx, msg = request()
    await weights._on_request(WeightSend(group=group, version=1), ctx)
    assert cast(WeightSending, msg.replies[0]).version == 2


async def test_a_generator_holds_one_group_and_the_oldest_goes_first(tmp_path: Path) -> None:
    senders: list[FakeSender] = []
    weights = server(senders, max_groups=2)
    await open_group(weights, "gen-0")
    await open_group(weights, "gen-0")
    assert senders[0].closed and not senders[1].closed
    await open_group(weights, "gen-1")
    await open_group(weights, "gen-2")
    assert senders[1].closed, "the least recently used group made room"
    assert weights.statistics()["weight_groups"] == 2
    await weights.close()
    assert all(s.closed for s in senders)


# ---------------------------------------------------------------- the generator's receiver


@dataclass
class FakeEngine:
    urls: list[str] = field(default_factory=lambda: ["http://a", "http://b"])
    fail_load: bool = False
    calls: list[str] = field(default_factory=list)

    async def init_weights_update_group(self, **kwargs: Any) -> None:
        self.calls.append(f"init {kwargs['group_name']} {kwargs['world_size']}")

    async def load_weights_from_distributed(
        self, version: int, params: Sequence[TensorSpec], *, group_name: str = ""
    ) -> None:
        self.calls.append(f"load {version} {group_name} {len(params)}")
        if self.fail_load:
            raise WeightUpdateError(version, "Connection closed by peer")

    async def destroy_weights_update_group(self, group_name: str = "") -> None:
        self.calls.append(f"destroy {group_name}")


@dataclass
class FakeLearner:
    """Answers the receiver's requests as the weight server would."""

    groups: int = 0
    asked: list[Message] = field(default_factory=list)
    refuse: bool = False
    #: Groups it holds; a restart forgets them.
    held: set[str] = field(default_factory=set)

    async def request(self, subject: str, data: bytes, **options: float) -> Any:
        message = ANY.decode(data)
        self.asked.append(message)
        answer: Message
        if self.refuse:
            answer = ErrorReply(code=ErrorCode.UNAVAILABLE, message="version 9 is not held here")
        elif isinstance(message, WeightGroupOpen):
            self.groups += 1
            self.held.add(f"g{self.groups}")
            answer = WeightGroup(
                group=f"g{self.groups}",
                master_address="127.0.0.1",
                master_port=29500,
                world_size=1 + message.servers,
            )
        elif isinstance(message, WeightSend) and message.group not in self.held:
            answer = ErrorReply(code=ErrorCode.VALIDATION, message="no group", field="$.group")
        else:
            assert isinstance(message, WeightSend)
            answer = WeightSending(
                group=message.group, version=message.version, digest="d", tensors=[]
            )
        return type("Reply", (), {"data": encode(answer)})()


def receiver(engine: FakeEngine, learner: FakeLearner) -> WeightReceiver:
    assert isinstance(engine, BroadcastEngine)
    return WeightReceiver(cast(Any, learner), engine, "gen-0", LOG)


def broadcast_update(version: int, path: str = "") -> PolicyUpdate:
    return PolicyUpdate(
        version=version,
        uri=subjects.policy_weights("learner-0"),
        digest="d",
        format=WeightFormat.TORCH_DISTRIBUTED,
        path=path,
    )


async def test_the_receiver_opens_one_group_for_many_versions() -> None:
    engine, learner = FakeEngine(), FakeLearner()
    weights = receiver(engine, learner)
    assert await weights.load(broadcast_update(1)) == 1
    assert await weights.load(broadcast_update(2)) == 2
    assert engine.calls == ["init g1 3", "load 1 g1 0", "load 2 g1 0"]
    await weights.close()
    assert engine.calls[-1] == "destroy g1"


async def test_after_a_failure_the_servers_leave_the_group_and_the_next_version_opens_one() -> None:
    engine, learner = FakeEngine(fail_load=True), FakeLearner()
    weights = receiver(engine, learner)
    with pytest.raises(WeightUpdateError):
        await weights.load(broadcast_update(1))
    assert engine.calls[-1] == "destroy g1"
    assert weights.group is None
    engine.fail_load = False
    assert await weights.load(broadcast_update(2)) == 2
    assert engine.calls[-2:] == ["init g2 3", "load 2 g2 0"]


async def test_a_learner_that_forgot_the_group_gets_a_new_one_at_once() -> None:
    engine, learner = FakeEngine(), FakeLearner()
    weights = receiver(engine, learner)
    await weights.load(broadcast_update(1))
    learner.held.clear()  # restarted under the same name
    assert await weights.load(broadcast_update(2)) == 2
    assert engine.calls[1:] == ["load 1 g1 0", "destroy g1", "init g2 3", "load 2 g2 0"]


async def test_a_refusal_is_an_engine_error_naming_the_reason() -> None:
    weights = receiver(FakeEngine(), FakeLearner(refuse=True))
    with pytest.raises(EngineError, match="not held here"):
        await weights.load(broadcast_update(9))


async def test_the_receiver_refuses_a_uri_that_is_not_a_weight_subject() -> None:
    weights = receiver(FakeEngine(), FakeLearner())
    update = PolicyUpdate(
        version=1, uri="/shared/v1", digest="d", format=WeightFormat.TORCH_DISTRIBUTED
    )
    with pytest.raises(EngineError, match="not a learner weight subject"):
        await weights.load(update)


# ---------------------------------------------------------------- the generator's choice


@dataclass
class DiskEngine:
    """An engine without a broadcast receiver (like the torch engine)."""

    name: str = "torch"
    loaded: list[tuple[int, str]] = field(default_factory=list)

    async def load_weights(self, version: int, source: str) -> None:
        self.loaded.append((version, source))


@dataclass
class FailingReceiver:
    async def load(self, update: PolicyUpdate) -> int:
        raise WeightUpdateError(update.version, "Connection closed by peer")


def generator(engine: DiskEngine, *, fallback: bool = True) -> GeneratorService:
    settings = GeneratorSettings(weight_disk_fallback=fallback)
    return GeneratorService(settings, engine=cast(Any, engine))


async def test_an_engine_without_a_receiver_loads_the_directory(tmp_path: Path) -> None:
    exported = published(tmp_path, 4)
    engine = DiskEngine()
    update = distributed_update(exported)
    assert await generator(engine)._fetch(update) == 4
    assert engine.loaded == [(4, str(exported.path))]


async def test_an_engine_without_a_receiver_and_no_directory_fails_clearly() -> None:
    with pytest.raises(EngineError, match="torch engine cannot receive"):
        await generator(DiskEngine())._fetch(broadcast_update(4))


async def test_a_failed_broadcast_falls_back_to_the_directory(tmp_path: Path) -> None:
    exported = published(tmp_path, 5)
    engine = DiskEngine()
    service = generator(engine)
    service._receiver = cast(Any, FailingReceiver())
    assert await service._fetch(distributed_update(exported)) == 5
    assert engine.loaded == [(5, str(exported.path))]
    assert service.broadcast_failures == 1


async def test_without_fallback_a_failed_broadcast_fails_the_update(tmp_path: Path) -> None:
    engine = DiskEngine()
    service = generator(engine, fallback=False)
    service._receiver = cast(Any, FailingReceiver())
    with pytest.raises(WeightUpdateError, match="Connection closed"):
        await service._fetch(distributed_update(published(tmp_path, 6)))
    assert engine.loaded == []


def distributed_update(exported: Exported) -> PolicyUpdate:
    return PolicyUpdate(
        version=exported.version,
        uri=subjects.policy_weights("learner-0"),
        digest=exported.digest,
        format=WeightFormat.TORCH_DISTRIBUTED,
        path=str(exported.path),
    )
