"""The harbor kind's pieces that run no sandbox: a task's sandbox place in its metadata,
the generator opening each session there, and how the verifier's run is judged."""

from __future__ import annotations

import base64
import io
import json
import tarfile
from collections.abc import Mapping
from pathlib import Path

import pytest

from protocol.messages import (
    ChatMessage,
    RolloutStatus,
    SamplingParams,
    SandboxLimits,
    SandboxResult,
    SandboxStatus,
    Task,
)
from services.domains.api import DomainError
from services.domains.config import ConfigError
from services.domains.harbor import load_task
from services.domains.harbor_domain import HarborProblem, archive_tests, domain
from services.domains.harbor_image import TaskImage
from services.domains.registry import load_registry
from services.domains.sandbox_place import SandboxPlace, place_of
from services.generator.agent import AgentLoop
from services.generator.tools import LocalTools, ToolSession
from services.model.tokens import ChatTokenizer
from services.validator.base import InfraFailure, InvalidRollout
from services.validator.harbor import judged
from tests.unit.test_generator_agent import ScriptedEngine, _call

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "harbor"
LIMITS = SandboxLimits(timeout_s=30.0, cpus=1.0, memory_mb=512, disk_mb=64)


def test_a_place_round_trips_through_task_metadata() -> None:
    place = SandboxPlace(image="temper-harbor:0123456789abcdef", limits=LIMITS)
    metadata = json.loads(json.dumps(place.metadata()))  # as plain data on the wire
    assert place_of(metadata) == place
    assert place_of({"other": 1}) is None
    assert place_of({"sandbox_image": "x"}) == SandboxPlace(image="x")


@pytest.mark.parametrize(
    ("metadata", "said"),
    [
        ({"sandbox_image": 3}, "metadata['sandbox_image'] must be an image name, not 3"),
        ({"sandbox_image": ""}, "must be an image name"),
        ({"sandbox_limits": {"memory_mb": -1}}, "metadata['sandbox_limits']: Expected `int` >= 1"),
        ({"sandbox_limits": "big"}, "metadata['sandbox_limits']: Expected `object`"),
    ],
)
def test_a_bad_place_names_the_entry(metadata: dict[str, object], said: str) -> None:
    with pytest.raises(ValueError) as refused:
        place_of(metadata)
    assert said in str(refused.value)


class PlacedTools(LocalTools):
    """LocalTools that remember the place each session was opened with."""

    def __init__(self) -> None:
        self.places: list[SandboxPlace | None] = []

    async def open(
        self,
        trajectory_id: str,
        allowed: tuple[str, ...],
        files: Mapping[str, bytes] | None = None,
        snapshot: str | None = None,
        *,
        place: SandboxPlace | None = None,
    ) -> ToolSession:
        self.places.append(place)
        return await super().open(trajectory_id, allowed, files, snapshot)


def _task(metadata: dict[str, object]) -> Task:
    return Task(
        id="h1",
        domain="harbor",
        prompt=[ChatMessage(role="user", content="count")],
        tools=["echo"],
        max_turns=2,
        sampling=SamplingParams(max_tokens=64),
        metadata=metadata,
    )


async def test_the_generator_opens_the_session_in_the_tasks_place(
    tiny_model: Path,
) -> None:
    tokenizer = ChatTokenizer.load(tiny_model)
    call = _call(tokenizer, {"name": "echo", "arguments": {"x": 1}})
    place = SandboxPlace(image="temper-harbor:0123456789abcdef", limits=LIMITS)
    tools = PlacedTools()
    engine = ScriptedEngine([call, tokenizer.encode("Done.") + list(tokenizer.eos_ids)] * 2)
    [placed] = await AgentLoop(engine, tokenizer, tools).run(_task(place.metadata()))
    [plain] = await AgentLoop(engine, tokenizer, tools).run(_task({}))
    assert placed.status is RolloutStatus.OK and plain.status is RolloutStatus.OK
    assert tools.places == [place, None]
    bad = await AgentLoop(ScriptedEngine([call]), tokenizer, tools).run(_task({"sandbox_image": 7}))
    assert bad[0].status is RolloutStatus.INVALID and "sandbox_image" in (bad[0].error or "")


# ---------------------------------------------------------------- the verifier's run


def problem() -> HarborProblem:
    task = load_task(FIXTURES / "count-timeouts")
    image = TaskImage(
        tag="temper-harbor:0123456789abcdef", inputs="0" * 64, workdir="/app", built=False
    )
    return HarborProblem(
        task=task, key="harbor:count-timeouts:x", image=image, tests=b"", limits=LIMITS
    )


def run(status: SandboxStatus, exit_code: int = 0, **files: bytes) -> SandboxResult:
    encoded = {name.replace("_", "."): base64.b64encode(v).decode() for name, v in files.items()}
    line = json.dumps({"exit": exit_code, "files": encoded})
    return SandboxResult(id="r", status=status, stdout=f"{line}\n", stderr="expected 5, found ''")


def test_the_reward_test_sh_wrote_is_the_score() -> None:
    assert judged(problem(), run(SandboxStatus.OK, reward_txt=b"1\n"))[0] == 1.0
    score, said = judged(problem(), run(SandboxStatus.OK, 1, reward_json=b'{"reward": 0.5}'))
    assert score == 0.5 and said == "reward 0.5 from reward.json (tests/test.sh exited 1)"


@pytest.mark.parametrize(
    "result",
    [
        run(SandboxStatus.TIMEOUT, reward_txt=b"1"),
        run(SandboxStatus.OOM),
        run(SandboxStatus.KILLED),
        run(SandboxStatus.OUTPUT_LIMIT),
        # Killed by a signal (137: SIGKILL), whatever reward is there.
        run(SandboxStatus.OK, 137, reward_txt=b"1"),
        SandboxResult(id="r", status=SandboxStatus.OK, stdout="1\n"),
    ],
)
def test_a_verifier_cut_off_scores_zero(result: SandboxResult) -> None:
    score, said = judged(problem(), result)
    assert score == 0.0 and str(FIXTURES / "count-timeouts") in said


@pytest.mark.parametrize(
    ("result", "reason"),
    [
        (run(SandboxStatus.OK), "tests/test.sh wrote no reward (exited 0): expected 5"),
        (run(SandboxStatus.NONZERO_EXIT, 2), "tests/test.sh wrote no reward (exited 2)"),
        (run(SandboxStatus.OK, reward_txt=b"1.5"), "reward.txt's reward 1.5 is outside [0, 1]"),
        (run(SandboxStatus.OK, reward_json=b"{}"), "reward.json has no 'reward' key"),
    ],
)
def test_no_reward_or_a_bad_one_is_invalid_naming_the_task(
    result: SandboxResult, reason: str
) -> None:
    with pytest.raises(InvalidRollout) as refused:
        judged(problem(), result)
    assert str(FIXTURES / "count-timeouts") in str(refused.value)
    assert reason in str(refused.value)


def test_a_failed_sandbox_is_an_infra_failure() -> None:
    with pytest.raises(InfraFailure):
        judged(problem(), SandboxResult(id="r", status=SandboxStatus.INFRA_ERROR, error="gone"))


def test_tests_are_archived_relative_to_their_folder_without_owners_or_times() -> None:

    task = load_task(FIXTURES / "fix-word-count")
    with tarfile.open(fileobj=io.BytesIO(archive_tests(task)), mode="r:gz") as tar:
        names = sorted(m.name for m in tar.getmembers())
        assert {m.uid for m in tar.getmembers()} == {0} and {m.mtime for m in tar.getmembers()} == {
            0
        }
    assert names == ["sample-one.txt", "sample-two.txt", "test.sh"]
    assert archive_tests(task) == archive_tests(task)


# ---------------------------------------------------------------- the kind's parameters


@pytest.mark.parametrize(
    ("params", "said"),
    [
        ({}, "parameter 'path' (the folder of Harbor tasks) is required"),
        ({"path": str(FIXTURES), "paths": 1}, "unknown parameters ['paths']"),
        ({"path": str(FIXTURES), "allow_bases": "mine"}, "'allow_bases' is 'mine'"),
        ({"path": str(FIXTURES), "max_turns": 0}, "'max_turns' is 0"),
    ],
)
def test_bad_parameters_name_the_domain(params: dict[str, object], said: str) -> None:
    with pytest.raises(DomainError) as refused:
        domain("mine", params)
    assert "domain 'mine'" in str(refused.value) and said in str(refused.value)


def test_a_config_declaring_bad_tasks_names_the_file_and_each_task(tmp_path: Path) -> None:
    """Refused at load, before any image is built (no Docker needed to say so)."""
    config = tmp_path / "domains.toml"
    bad = FIXTURES.parent / "harbor-bad"
    config.write_text(
        f'[[domain]]\nname = "mine"\nkind = "harbor"\nparams = {{ path = "{bad}" }}\n'
    )
    with pytest.raises(ConfigError) as refused:
        load_registry(config, plugins=False)
    said = str(refused.value)
    assert str(config) in said and "domain 'mine'" in said and "3 of 3 tasks refused" in said
    for name in ("foreign-base", "malformed-toml", "missing-test"):
        assert f"{name}: " in said
