"""The learner's weight server: new versions broadcast straight into SGLang servers.

With ``weight_transport = "distributed"`` the learner still writes every version to disk
(that directory is what resume, evaluation and engines without a broadcast read) and also
holds the version's tensors in memory, read back from the bytes it just wrote: the
broadcast carries exactly what the announcement's digest names, and training goes on
while generators receive.  Generators ask on ``subjects.policy_weights(instance)``:

- WeightGroupOpen -> WeightGroup: a process group for that generator's servers (this
  learner is rank 0, the rendezvous a free port on ``master_address``).  The learner joins
  it in a thread right after the reply while the servers join from their side.  One group
  per generator instance (its next open replaces it), at most ``max_groups`` (the least
  recently used is closed first).
- WeightSend -> WeightSending: right after the reply the learner broadcasts the tensors,
  in a thread, while the generator has its servers receive them.  A broadcast that fails
  or times out closes the group; the servers' receive then fails at once (their peer is
  gone), they keep their old weights, and the generator opens a new group next time.

Only announced versions leave: the version being announced goes to whoever asks for it,
and to those asking for an older one only once its announcement is out.
"""

from __future__ import annotations

import asyncio
import itertools
import re
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, get_args

import msgspec
import structlog

from protocol import subjects
from protocol.codec import Codec, encode
from protocol.errors import ErrorCode
from protocol.messages import (
    Message,
    PolicyUpdate,
    WeightFormat,
    WeightGroup,
    WeightGroupOpen,
    WeightSend,
    WeightSending,
    WeightTensor,
)
from services.learner.trainer import Exported
from services.model.weights import WEIGHTS_FILE
from services.runtime.errors import RequestRejected
from services.runtime.ports import free_port
from services.runtime.responder import Request
from services.runtime.service import Service

#: The learner's ``weight_transport`` setting.
WeightTransport = Literal["disk", "distributed"]
TRANSPORTS: tuple[str, ...] = get_args(WeightTransport)

_REQUESTS: Codec[WeightGroupOpen | WeightSend] = Codec(WeightGroupOpen | WeightSend)


@dataclass(frozen=True, kw_only=True)
class BroadcastSettings:
    #: The address the inference servers reach this learner at (the rendezvous host).
    master_address: str = "127.0.0.1"
    backend: str = "gloo"
    #: Joining a group, and one broadcast: past this the group is closed.
    timeout_s: float = 120.0
    #: Open groups (one per generator instance); the least recently used goes first.
    max_groups: int = 16


class Sender(Protocol):
    """Rank 0 of one group (blocking calls, run in a thread): :class:`GlooWeightSender`."""

    def connect(self) -> None: ...

    def broadcast(self, named_tensors: Sequence[tuple[str, Any]]) -> None: ...

    def close(self) -> None: ...


SenderFactory = Callable[[WeightGroup, float], Sender]


def gloo_sender(offer: WeightGroup, timeout_s: float) -> Sender:
    from services.engines.sglang.broadcast import GlooWeightSender

    return GlooWeightSender(
        master_address=offer.master_address,
        master_port=offer.master_port,
        world_size=offer.world_size,
        group_name=offer.group,
        backend=offer.backend,
        timeout_s=timeout_s,
    )


@dataclass(frozen=True)
class Snapshot:
    """One version's tensors, in broadcast order (sorted by name)."""

    version: int
    digest: str
    tensors: list[tuple[str, Any]]

    def specs(self) -> list[WeightTensor]:
        return [
            WeightTensor(name=name, dtype=str(t.dtype).removeprefix("torch."), shape=list(t.shape))
            for name, t in self.tensors
        ]


def read_snapshot(exported: Exported) -> Snapshot:
    """The tensors of a published directory, owned by this process (blocking)."""
    from safetensors.torch import load

    # From the bytes, not a memory map: the directory may be pruned during a broadcast.
    tensors = load((exported.path / WEIGHTS_FILE).read_bytes())
    return Snapshot(exported.version, exported.digest, sorted(tensors.items()))


@dataclass(eq=False)
class _Group:
    offer: WeightGroup
    instance: str
    sender: Sender
    joined: asyncio.Future[bool] = field(default_factory=asyncio.Future)
    busy: bool = False


class WeightServer:
    """Owned by the learner service: :meth:`listen` in ``setup``, :meth:`offer` before each
    announcement, :meth:`announced` after it, :meth:`close` in ``teardown``."""

    def __init__(
        self,
        settings: BroadcastSettings,
        instance: str,
        log: structlog.typing.FilteringBoundLogger,
        sender_factory: SenderFactory = gloo_sender,
    ) -> None:
        self.settings = settings
        self.subject = subjects.policy_weights(_as_token(instance))
        self._instance = instance
        self._log = log
        self._sender_factory = sender_factory
        self._groups: OrderedDict[str, _Group] = OrderedDict()
        self._numbers = itertools.count(1)
        self._snapshot: Snapshot | None = None
        self._announced = -1
        self.groups_opened = 0
        self.broadcasts = 0
        self.failures = 0
        self.last_broadcast_s = 0.0
        self.last_snapshot_s = 0.0

    def listen(self, service: Service) -> None:
        service.respond(self.subject, _REQUESTS, self._on_request)

    # ------------------------------------------------------------ the learner's hooks

    async def offer(self, exported: Exported, update: PolicyUpdate) -> PolicyUpdate:
        """``update`` as a distributed announcement; the snapshot is taken first."""
        held = self._snapshot
        if held is None or (held.version, held.digest) != (exported.version, exported.digest):
            started = time.perf_counter()
            self._snapshot = await asyncio.to_thread(read_snapshot, exported)
            self.last_snapshot_s = time.perf_counter() - started
        return msgspec.structs.replace(
            update, format=WeightFormat.TORCH_DISTRIBUTED, uri=self.subject, path=update.uri
        )

    def announced(self, version: int) -> None:
        self._announced = max(self._announced, version)

    async def close(self) -> None:
        """Close every group not broadcasting (a broadcast in flight ends by its timeout)."""
        for group in list(self._groups.values()):
            if not group.busy:
                await self._close(group)

    # ------------------------------------------------------------ requests

    async def _on_request(self, request: WeightGroupOpen | WeightSend, ctx: Request) -> None:
        # Each handler replies itself, then joins or broadcasts: the servers do their half
        # only once they have the reply.
        if isinstance(request, WeightGroupOpen):
            await self._open(request, ctx)
        else:
            await self._send(request, ctx)

    async def _open(self, request: WeightGroupOpen, ctx: Request) -> None:
        group = await self._new_group(request)
        joined = False
        try:
            await _reply(ctx, group.offer)
            await asyncio.to_thread(group.sender.connect)
            joined = True
        except Exception as error:
            self.failures += 1
            self._log.warning("weight_group_failed", group=group.offer.group, error=repr(error))
            await self._close(group)
        finally:
            group.joined.set_result(joined)
        if joined:
            self._log.info(
                "weight_group_joined", group=group.offer.group, generator=request.instance
            )

    async def _new_group(self, request: WeightGroupOpen) -> _Group:
        for old in [g for g in self._groups.values() if g.instance == request.instance]:
            await self._close(old)
        while len(self._groups) >= self.settings.max_groups:
            await self._close(next(iter(self._groups.values())))
        name = f"temper-{_as_token(self._instance)}-{next(self._numbers)}"
        offer = WeightGroup(
            group=name,
            master_address=self.settings.master_address,
            master_port=free_port(self.settings.master_address),
            world_size=1 + request.servers,
            backend=self.settings.backend,
        )
        group = _Group(
            offer, request.instance, self._sender_factory(offer, self.settings.timeout_s)
        )
        self._groups[name] = group
        self.groups_opened += 1
        return group

    async def _send(self, request: WeightSend, ctx: Request) -> None:
        group = self._groups.get(request.group)
        if group is None:
            # Named by field, so a generator can tell "open a new group" from other refusals.
            raise RequestRejected(
                ErrorCode.VALIDATION, f"no open weight group {request.group!r}", field="$.group"
            )
        if group.busy:
            raise RequestRejected(ErrorCode.BAD_REQUEST, f"group {request.group!r} is busy")
        snapshot = self._servable(request.version)
        self._groups.move_to_end(request.group)
        group.busy = True
        try:
            await self._wait_joined(group)
            await _reply(ctx, _sending(group.offer.group, snapshot))
            await self._broadcast(group, snapshot)
        finally:
            group.busy = False

    def _servable(self, version: int) -> Snapshot:
        held = self._snapshot
        if held is not None and (
            held.version == version or version < held.version <= self._announced
        ):
            return held
        holding = "nothing" if held is None else f"version {held.version}"
        raise RequestRejected(
            ErrorCode.UNAVAILABLE, f"version {version} is not held here (holding {holding})"
        )

    async def _wait_joined(self, group: _Group) -> None:
        try:
            async with asyncio.timeout(self.settings.timeout_s):
                joined = await asyncio.shield(group.joined)
        except TimeoutError:
            joined = False
        if not joined:
            raise RequestRejected(
                ErrorCode.UNAVAILABLE, f"group {group.offer.group!r} was never joined"
            )

    async def _broadcast(self, group: _Group, snapshot: Snapshot) -> None:
        started = time.perf_counter()
        try:
            await asyncio.to_thread(group.sender.broadcast, snapshot.tensors)
        except Exception as error:
            self.failures += 1
            self._log.error(
                "weight_broadcast_failed",
                group=group.offer.group,
                version=snapshot.version,
                error=repr(error),
            )
            await self._close(group)
            return
        self.broadcasts += 1
        self.last_broadcast_s = time.perf_counter() - started
        self._log.info(
            "weights_broadcast",
            group=group.offer.group,
            version=snapshot.version,
            seconds=round(self.last_broadcast_s, 4),
        )

    async def _close(self, group: _Group) -> None:
        if self._groups.pop(group.offer.group, None) is None:
            return
        try:
            await asyncio.to_thread(group.sender.close)
        except Exception as error:  # the group is gone from here either way
            self._log.warning(
                "weight_group_close_failed", group=group.offer.group, error=repr(error)
            )

    def statistics(self) -> dict[str, float]:
        return {
            "weight_groups": float(len(self._groups)),
            "weight_groups_opened": float(self.groups_opened),
            "weight_broadcasts": float(self.broadcasts),
            "weight_broadcast_failures": float(self.failures),
            "weight_broadcast_s": self.last_broadcast_s,
            "weight_snapshot_s": self.last_snapshot_s,
        }


def _as_token(instance: str) -> str:
    """``instance`` as a subject token: a default instance name holds the host name,
    whose dots a subject token cannot."""
    return re.sub(r"[^A-Za-z0-9_\-]", "-", instance).lstrip("-_")[:100] or "learner"


def _sending(group: str, snapshot: Snapshot) -> WeightSending:
    return WeightSending(
        group=group, version=snapshot.version, digest=snapshot.digest, tensors=snapshot.specs()
    )


async def _reply(ctx: Request, message: Message) -> None:
    if not ctx.msg.reply:
        raise RequestRejected(ErrorCode.BAD_REQUEST, "a weight request needs a reply subject")
    await ctx.msg.respond(encode(message))


def make_weight_server(
    transport: str, settings: BroadcastSettings, instance: str, log: Any
) -> WeightServer | None:
    """The weight server of a learner with ``transport`` (None for ``disk``)."""
    if transport not in TRANSPORTS:
        raise ValueError(f"weight_transport {transport!r} is not one of {', '.join(TRANSPORTS)}")
    return WeightServer(settings, instance, log) if transport == "distributed" else None
