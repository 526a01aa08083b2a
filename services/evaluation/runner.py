"""Held-out evaluations through the live stack: eval tasks in, accuracy lines out.

Each evaluation publishes every held-out problem as eval-tier tasks (one greedy sample,
``samples`` sampled ones), collects their scored rollouts from the bus, and once all are
in appends one JSON line to ``heldout.jsonl`` and writes the evaluation's unit, chain and
system figures to ``tiers/v<version>.json`` beside it.  The replay buffer never trains on
them (their tasks are of the eval split).
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from protocol import subjects
from protocol.codec import Codec, encode
from protocol.errors import DecodeError
from protocol.messages import ScoredRollout
from services.evaluation.heldout import Evaluation, HeldoutSet

_SCORED: Codec[ScoredRollout] = Codec(ScoredRollout)


class HeldoutRunner:
    def __init__(self, nc: NATS, heldout: HeldoutSet, samples: int, out: Path) -> None:
        self._nc = nc
        self.heldout = heldout
        self.samples = samples
        self.out = out
        self._run = f"heldout{int(time.time())}"
        self._pending: list[Evaluation] = []
        self._count = 0
        self.results: list[dict[str, Any]] = []
        #: Tiered report by the version it measured.
        self.tiers: dict[int, dict[str, Any]] = {}

    async def start(self) -> None:
        self.out.parent.mkdir(parents=True, exist_ok=True)
        await self._nc.subscribe(subjects.scored_all(), cb=self._on_scored)

    @property
    def busy(self) -> bool:
        return bool(self._pending)

    async def submit(self, elapsed_s: float) -> None:
        """Start one evaluation of whatever version the generators serve now."""
        self._count += 1
        prefix = f"{self._run}-{self._count}"
        evaluation = Evaluation(
            prefix=prefix, heldout=self.heldout, samples=self.samples, elapsed_s=elapsed_s
        )
        self._pending.append(evaluation)
        js = self._nc.jetstream()
        for task in self.heldout.tasks(prefix, self.samples):
            # Stamped at submission: the tiered report's latency runs from here to scoring.
            task = msgspec.structs.replace(task, created_at=time.time())
            subject = subjects.of_task(task)
            await js.publish(subject, encode(task), headers={"Nats-Msg-Id": task.id})

    async def _on_scored(self, msg: Msg) -> None:
        task_id = msg.subject.rsplit(".", 1)[-1]
        if not task_id.startswith(self._run):
            return
        try:
            scored = _SCORED.decode(msg.data)
        except DecodeError:
            return
        for evaluation in self._pending:
            evaluation.add(scored)

    def completed(self) -> list[dict[str, Any]]:
        """Results of the evaluations finished since the last call, also written to the file."""
        done = [e for e in self._pending if e.done()]
        self._pending = [e for e in self._pending if not e.done()]
        lines = [self._finish(e) for e in done]
        with self.out.open("a") as handle:
            for line in lines:
                handle.write(json.dumps(line) + "\n")
        self.results.extend(lines)
        return lines

    def _finish(self, evaluation: Evaluation) -> dict[str, Any]:
        line = evaluation.result()
        report = evaluation.tier_report(policy=f"v{line['version']}")
        path = self.out.parent / "tiers" / f"v{line['version']}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=2) + "\n")
        self.tiers[int(line["version"])] = report
        return {**line, "tiers_file": str(path)}

    async def drain(self, timeout_s: float) -> list[dict[str, Any]]:
        """Wait (bounded) for the pending evaluations; their results."""
        lines: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout_s
        while self._pending and time.monotonic() < deadline:
            await asyncio.sleep(0.25)
            lines.extend(self.completed())
        return lines
