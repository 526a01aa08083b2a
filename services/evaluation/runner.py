"""Held-out evaluations through the live stack: eval tasks in, accuracy lines out.

Each evaluation publishes every held-out problem of every domain as eval-tier tasks (one
greedy sample, ``samples`` sampled ones), collects their scored rollouts from the bus, and
once all are in appends one JSON line per domain to ``heldout.jsonl`` and writes the
evaluation's unit, chain and system figures to ``tiers/v<version>.json`` beside it.  With
several domains, the macro average (each domain counting the same) goes to
``heldout_macro.jsonl``.  The replay buffer never trains on them (their tasks are of the
eval split).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from protocol import subjects
from protocol.codec import Codec, encode
from protocol.errors import DecodeError
from protocol.messages import ScoredRollout
from services.evaluation.heldout import Evaluation, EvaluationRound, HeldoutSet, macro_average

_SCORED: Codec[ScoredRollout] = Codec(ScoredRollout)


@dataclass(frozen=True, kw_only=True)
class RoundResult:
    """One finished evaluation: a line per domain, and its headline: the macro average
    over the domains (the one domain's line when there is one)."""

    domains: tuple[dict[str, Any], ...]
    headline: dict[str, Any]


class HeldoutRunner:
    def __init__(self, nc: NATS, sets: Sequence[HeldoutSet], samples: int, out: Path) -> None:
        if not sets:
            raise ValueError("a held-out evaluation needs at least one domain")
        self._nc = nc
        self.sets = tuple(sets)
        self.samples = samples
        self.out = out
        #: Where the macro averages go, with several domains.
        self.macro_out = out.with_name(out.stem + "_macro" + out.suffix)
        self._run = f"heldout{int(time.time())}"
        self._pending: list[EvaluationRound] = []
        self._count = 0
        self.results: list[RoundResult] = []
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
        evaluations = tuple(
            Evaluation(
                prefix=f"{self._run}-{self._count}-{index}",
                heldout=heldout,
                samples=self.samples,
                elapsed_s=elapsed_s,
            )
            for index, heldout in enumerate(self.sets)
        )
        self._pending.append(EvaluationRound(number=self._count, evaluations=evaluations))
        js = self._nc.jetstream()
        for evaluation in evaluations:
            for task in evaluation.heldout.tasks(evaluation.prefix, self.samples):
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

    def completed(self) -> list[RoundResult]:
        """Evaluations finished since the last call, also written to the files."""
        done = [r for r in self._pending if r.done()]
        self._pending = [r for r in self._pending if not r.done()]
        results = [self._finish(r) for r in done]
        self._append(self.out, [line for r in results for line in r.domains])
        if len(self.sets) > 1:
            self._append(self.macro_out, [r.headline for r in results])
        self.results.extend(results)
        return results

    @staticmethod
    def _append(path: Path, lines: list[dict[str, Any]]) -> None:
        with path.open("a") as handle:
            for line in lines:
                handle.write(json.dumps(line) + "\n")

    def _finish(self, round_: EvaluationRound) -> RoundResult:
        version = round_.version()
        report = round_.tier_report(policy=f"v{version}")
        path = self.out.parent / "tiers" / f"v{version}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=2) + "\n")
        self.tiers[version] = report
        lines = tuple({**line, "tiers_file": str(path)} for line in round_.results())
        headline = lines[0] if len(lines) == 1 else macro_average(list(lines), version)
        return RoundResult(domains=lines, headline={**headline, "tiers_file": str(path)})

    async def drain(self, timeout_s: float) -> list[RoundResult]:
        """Wait (bounded) for the pending evaluations; their results."""
        results: list[RoundResult] = []
        deadline = time.monotonic() + timeout_s
        while self._pending and time.monotonic() < deadline:
            await asyncio.sleep(0.25)
            results.extend(self.completed())
        return results
