"""The stack as a user starts it: `temper up` with the deploy domain config, settings from
the environment only.  Every built-in domain and one domain of each kind of the config
(both compiled languages, every terminal domain) get their reference solution scored
through the running sandbox and validator: each must score its maximum.

This is the path the unit tests never see: a setting that only goes wrong when read from
the environment (the sandbox's maxima once collapsed to its defaults there, and every
CAD, C++ and JavaScript rollout became ``infra_failure``) fails here.
"""

from __future__ import annotations

import json
import re
import signal
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from protocol import streams
from protocol.codec import Codec
from protocol.messages import Rollout, ScoredRollout, ScoreStatus, ToolCall
from services.domains import Domain, load_registry
from services.domains.formats import TOOL_CALL_TAG
from services.domains.ranges import of_domain
from tests.integration import test_supervisor
from tests.integration.support import client, stream_entries, wait_count
from tests.integration.test_supervisor import Up
from tests.integration.test_validator_service import make_rollout, publish

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "domains"
SCORED: Codec[ScoredRollout] = Codec(ScoredRollout)
#: Kinds with several languages or templates: every domain of theirs, not one.
EVERY_DOMAIN_OF = frozenset({"compiled_functions", "terminal"})
CALL = re.compile(rf"<{TOOL_CALL_TAG}>(.*?)</{TOOL_CALL_TAG}>", re.DOTALL)

ups = test_supervisor.ups


def chosen() -> list[Domain]:
    """The built-ins, and a domain of each kind of the deploy config."""
    registry = load_registry(DEPLOY, plugins=False)
    picked: dict[str, Domain] = {d.name: d for d in load_registry(None, plugins=False)}
    kinds: set[str] = set()
    for domain in registry:
        if domain.kind in EVERY_DOMAIN_OF or domain.kind not in kinds:
            picked.setdefault(domain.name, domain)
            kinds.add(domain.kind)
    return list(picked.values())


def reference_rollout(domain: Domain) -> Rollout:
    """The domain's reference as a rollout: its text, and for a shell domain its bash
    calls as the generator records them (the validator replays them)."""
    example = domain.examples(1, "eval", seed=0)[0]
    if domain.kind != "terminal":
        return make_rollout(example.task, example.reference)
    calls = [
        ToolCall(turn=turn, name="bash", arguments=body, status="ok")
        for turn, body in enumerate(CALL.findall(example.reference))
    ]
    assert calls and all(json.loads(c.arguments)["name"] == "bash" for c in calls)
    return make_rollout(example.task, "Done.", tool_calls=calls)


@pytest.fixture
async def up(ups: list[Up], tmp_path: Path, sandbox_image: str) -> AsyncIterator[Up]:
    env = {
        "TEMPER_VALIDATOR_DOMAINS_CONFIG": str(DEPLOY),
        "TEMPER_SANDBOX_BACKEND": "docker",
        "TEMPER_SANDBOX_IMAGE": sandbox_image,
        "TEMPER_SANDBOX_POOL_SIZE": "2",
        # AF_UNIX paths are short: keep the sockets out of pytest's long tmp paths.
        "TEMPER_SANDBOX_STATE_DIR": tempfile.mkdtemp(prefix="tup-"),
        "TEMPER_SANDBOX_SNAPSHOT_DIR": str(tmp_path / "snapshots"),
    }
    services = ("--service", "control", "--service", "sandbox", "--service", "validator")
    stack = await Up.start(tmp_path / "run", *services, "--no-metrics", env=env)
    ups.append(stack)
    await stack.ready()
    yield stack
    # Stopped as a user stops it (Ctrl-C), so the sandbox removes its containers.
    stack.proc.send_signal(signal.SIGINT)
    await stack.rest(timeout_s=60)


async def test_every_kind_scores_its_reference_at_the_maximum_through_temper_up(up: Up) -> None:
    domains = chosen()
    kinds = {d.kind for d in domains}
    assert {"python_functions", "compiled_functions", "cad_parts", "terminal"} <= kinds
    async with client(up.url) as nc:
        js = nc.jetstream()
        for domain in domains:
            await publish(js, reference_rollout(domain))
        await wait_count(js, streams.SCORED.name, len(domains), timeout_s=240)
        entries = await stream_entries(js, streams.SCORED.name)
    scored = {s.rollout.task.domain: s for s in map(SCORED.decode, (e.data for e in entries))}
    wrong = {
        name: (s.status.value, s.reward, s.error or [d.message for d in s.details])
        for name, s in scored.items()
        if s.status is not ScoreStatus.SCORED
        or s.reward != pytest.approx(of_domain(next(d for d in domains if d.name == name)).high)
    }
    assert not wrong, wrong
