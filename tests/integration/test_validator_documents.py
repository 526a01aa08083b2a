"""The documents family through the running validator service: the reference scores 1,
each planted mistake less, with its reason in the scored rollout's details."""

from __future__ import annotations

from pathlib import Path

import pytest

from protocol.messages import ScoreStatus, Task
from services.domains import load_registry
from services.domains.documents.family import DocumentSpec, build, reference_answer
from services.validator import ValidatorService
from tests.documents_cases import planted
from tests.integration.support import client
from tests.integration.test_validator_service import (
    make_rollout,
    publish,
    scored_results,
    settings,
)

CONFIG = """
[[family]]
name = "docs-{format}"
kind = "documents"
matrix = { format = ["pdf", "html"] }
params = { length = "long", question = "combined" }
"""


def task_for(tasks: list[Task], spec: DocumentSpec) -> Task:
    """A task of the domain re-pointed at ``spec``: the validator reads only the spec."""
    base = tasks[0]
    metadata = {**base.metadata, "document": spec.as_metadata()}
    return Task(**{**{f: getattr(base, f) for f in base.__struct_fields__}, "metadata": metadata})


async def test_reference_and_planted_answers_through_the_service(
    nats_url: str, tmp_path: Path
) -> None:
    config = tmp_path / "domains.toml"
    config.write_text(CONFIG)
    registry = load_registry(config, plugins=False)
    service = ValidatorService(settings(nats_url, domains_config=config))
    rollouts, wanted = [], {}
    for fmt in ("pdf", "html"):
        spec = DocumentSpec(fmt, "long", "combined", 7)
        task = task_for(registry.get(f"docs-{fmt}").make_tasks(1, seed=0), spec)
        cases = [("reference", reference_answer(*build(spec)), "")] + [
            (c.name, c.text, c.reason) for c in planted(spec)
        ]
        for index, (name, text, reason) in enumerate(cases):
            rollouts.append(make_rollout(task, text, index=index))
            wanted[(fmt, index)] = (name, reason)
    async with service, client(nats_url) as nc:
        js = nc.jetstream()
        for rollout in rollouts:
            await publish(js, rollout)
        results = await scored_results(js, len(rollouts), timeout_s=60)
    assert len(results) == len(rollouts)
    for scored in results:
        fmt = scored.rollout.task.metadata["document"]["format"]
        name, reason = wanted[(fmt, scored.rollout.sample_index)]
        assert scored.status is ScoreStatus.SCORED, (name, scored.error)
        (detail,) = scored.details
        assert detail.name == "doc_file"
        if name == "reference":
            assert scored.reward == pytest.approx(1.0), detail.message
        else:
            assert scored.reward < 1.0 and reason in detail.message, (fmt, name, detail.message)
