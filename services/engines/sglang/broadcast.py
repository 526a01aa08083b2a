"""Weight broadcast from the learner to SGLang servers over a torch.distributed group.

:class:`TensorSpec` names what is sent, in order; :class:`GlooWeightSender` is rank 0 of the
group, the learner's half of :meth:`SGLangEngine.load_weights_from_distributed`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from services.engines.engine import EngineError


@dataclass(frozen=True)
class TensorSpec:
    """One parameter of a broadcast weight update, in broadcast order."""

    name: str
    dtype: str
    shape: tuple[int, ...]


class GlooWeightSender:
    """Rank 0 of a weight-update process group: broadcasts tensors to SGLang servers.

    The learner's half of :meth:`SGLangEngine.load_weights_from_distributed`.  SGLang
    builds its side with ``init_custom_process_group`` (a TCP rendezvous whose store is
    prefixed with the group name); this builds the matching group the same way with the
    same torch calls, so both ends agree on rendezvous keys and collective order.  Both
    must run the same torch release.  Blocking calls: run them in a thread next to the
    engine's coroutine (``asyncio.to_thread``).
    """

    def __init__(
        self,
        *,
        master_address: str,
        master_port: int,
        world_size: int,
        group_name: str = "temper_weights",
        backend: str = "gloo",
        timeout_s: float = 300.0,
    ) -> None:
        self.master_address = master_address
        self.master_port = master_port
        self.world_size = world_size
        self.group_name = group_name
        self.backend = backend
        self.timeout_s = timeout_s
        self._group: Any = None

    def connect(self) -> None:
        """Host the rendezvous and wait for every server to join (blocking)."""
        import datetime

        from torch.distributed.distributed_c10d import (
            Backend,
            GroupName,
            PrefixStore,
            _new_process_group_helper,
            _world,
        )
        from torch.distributed.rendezvous import rendezvous

        timeout = datetime.timedelta(seconds=self.timeout_s)
        # Rank 0 of a tcp:// rendezvous hosts the store the servers connect to.
        init_method = f"tcp://{self.master_address}:{self.master_port}"
        store, _, _ = next(rendezvous(init_method, 0, self.world_size, timeout=timeout))
        group, _ = _new_process_group_helper(
            self.world_size,
            0,
            [],
            Backend(self.backend),
            PrefixStore(self.group_name, store),
            group_name=GroupName(self.group_name),
            timeout=timeout,
        )
        # Group ranks equal global ranks here, as on SGLang's side.
        _world.pg_group_ranks[group] = {rank: rank for rank in range(self.world_size)}
        self._group = group

    @staticmethod
    def specs(named_tensors: Sequence[tuple[str, Any]]) -> list[TensorSpec]:
        return [
            TensorSpec(name, str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape))
            for name, tensor in named_tensors
        ]

    def broadcast(self, named_tensors: Sequence[tuple[str, Any]]) -> None:
        """Send each tensor from rank 0, in order (blocking until all servers received)."""
        import torch.distributed

        if self._group is None:
            raise EngineError("GlooWeightSender.broadcast before connect()")
        for _, tensor in named_tensors:
            torch.distributed.broadcast(tensor.contiguous(), src=0, group=self._group)

    def close(self) -> None:
        import torch.distributed

        group, self._group = self._group, None
        if group is not None:
            torch.distributed.destroy_process_group(group)
