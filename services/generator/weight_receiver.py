"""A generator's half of the distributed weight transport (the learner's half is
:mod:`services.learner.broadcast`).

For a ``torch_distributed`` PolicyUpdate, ``uri`` is the learner's weight subject.  The
first update asks it for a process group (WeightGroupOpen) and has every SGLang server join
it; each update then asks for the version (WeightSend) and runs the engine's weight
transaction, whose receive step takes the learner's broadcast.  Any failure abandons the
group: the servers leave it (``/destroy_weights_update_group``) and the next update opens
a new one, so one broken broadcast never blocks the versions after it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Protocol, TypeVar, runtime_checkable

import structlog
from nats.aio.client import Client as NATS

from protocol import subjects
from protocol.messages import (
    Message,
    PolicyUpdate,
    WeightGroup,
    WeightGroupOpen,
    WeightSend,
    WeightSending,
)
from services.engines.engine import EngineError
from services.engines.sglang.broadcast import TensorSpec
from services.runtime.ask import AskError, BadReply, Refused, ask

R = TypeVar("R", WeightGroup, WeightSending)
_SUBJECT_PREFIX = subjects.policy_weights("learner").removesuffix("learner")


class WeightTransferError(EngineError):
    """The learner did not answer, refused, or sent something else than announced."""


class GroupGone(WeightTransferError):
    """The learner holds no such group (it restarted, or closed it to make room)."""


@runtime_checkable
class BroadcastEngine(Protocol):
    """An engine whose servers can receive a broadcast (:class:`SGLangEngine`)."""

    urls: list[str]

    async def init_weights_update_group(
        self,
        *,
        master_address: str,
        master_port: int,
        world_size: int,
        group_name: str = ...,
        backend: str = ...,
    ) -> None: ...

    async def load_weights_from_distributed(
        self, version: int, params: Sequence[TensorSpec], *, group_name: str = ...
    ) -> None: ...

    async def destroy_weights_update_group(self, group_name: str = ...) -> None: ...


class WeightReceiver:
    """Loads ``torch_distributed`` updates into ``engine``; one group at a time."""

    def __init__(
        self,
        nc: NATS,
        engine: BroadcastEngine,
        instance: str,
        log: structlog.typing.FilteringBoundLogger,
        request_timeout_s: float = 10.0,
    ) -> None:
        self._nc = nc
        self._engine = engine
        self._instance = instance
        self._log = log
        self._timeout_s = request_timeout_s
        self._group: WeightGroup | None = None
        self._learner = ""
        #: Groups abandoned after a failure that the servers have not left yet.
        self._stale: list[str] = []

    @property
    def group(self) -> str | None:
        return self._group.group if self._group is not None else None

    async def load(self, update: PolicyUpdate) -> int:
        """Receive ``update`` (or a newer announced version); return the version served."""
        if not update.uri.startswith(_SUBJECT_PREFIX):
            raise WeightTransferError(f"{update.uri!r} is not a learner weight subject")
        await self._leave_stale()
        try:
            return await self._receive(update)
        except Exception:
            self._abandon()
            await self._leave_stale()
            raise
        except BaseException:  # cancelled: the servers leave the group on the next update
            self._abandon()
            raise

    async def close(self) -> None:
        self._abandon()
        await self._leave_stale()

    async def _receive(self, update: PolicyUpdate) -> int:
        fresh = self._group is None or self._learner != update.uri
        if fresh:
            self._abandon()
            self._group = await self._open(update.uri)
        try:
            sending = await self._ask_version(update)
        except GroupGone:
            if fresh:
                raise
            # A learner restarted under the same name forgot the group: open one more.
            self._abandon()
            await self._leave_stale()
            self._group = await self._open(update.uri)
            sending = await self._ask_version(update)
        specs = [TensorSpec(t.name, t.dtype, tuple(t.shape)) for t in sending.tensors]
        await self._engine.load_weights_from_distributed(
            sending.version, specs, group_name=sending.group
        )
        return sending.version

    async def _ask_version(self, update: PolicyUpdate) -> WeightSending:
        assert self._group is not None
        group = self._group.group
        request = WeightSend(group=group, version=update.version)
        sending = await self._ask(update.uri, request, WeightSending)
        if sending.group != group:
            raise WeightTransferError(f"the learner answered {sending!r} to WeightSend")
        if sending.version == update.version and sending.digest != update.digest:
            raise WeightTransferError(
                f"the learner sends digest {sending.digest}, the update says {update.digest}"
            )
        return sending

    async def _open(self, learner: str) -> WeightGroup:
        request = WeightGroupOpen(instance=self._instance, servers=len(self._engine.urls))
        offer = await self._ask(learner, request, WeightGroup)
        self._learner = learner
        try:
            await self._engine.init_weights_update_group(
                master_address=offer.master_address,
                master_port=offer.master_port,
                world_size=offer.world_size,
                group_name=offer.group,
                backend=offer.backend,
            )
        except BaseException:
            self._stale.append(offer.group)
            raise
        self._log.info("weight_group_joined", group=offer.group, learner=learner)
        return offer

    async def _ask(self, subject: str, request: Message, reply_type: type[R]) -> R:
        try:
            return await ask(self._nc, subject, request, reply_type, self._timeout_s)
        except Refused as error:
            kind = GroupGone if error.field == "$.group" else WeightTransferError
            raise kind(f"the learner refused: {error.code}: {error.message}") from None
        except BadReply as error:
            raise WeightTransferError(f"the learner's answer is unusable: {error.reason}") from None
        except AskError as error:
            raise WeightTransferError(
                f"the learner at {subject} did not answer: {error!r}"
            ) from None

    def _abandon(self) -> None:
        if self._group is not None:
            self._stale.append(self._group.group)
            self._group = None

    async def _leave_stale(self) -> None:
        stale, self._stale = self._stale, []
        for group in stale:
            # A server that never joined answers that the group does not exist: nothing to do.
            with contextlib.suppress(EngineError):
                await self._engine.destroy_weights_update_group(group)
            self._log.info("weight_group_left", group=group)
