"""Harbor task folders without Docker: loading and its refusals, limits, the Dockerfile's
base, the verifier's reward, and the export of the terminal templates."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from protocol.messages import SandboxLimits
from services.domains.harbor import (
    SANDBOX_IMAGE,
    HarborFolderError,
    HarborTaskError,
    RewardError,
    base_allowed,
    dockerfile_base,
    load_task,
    load_tasks,
    reward_of,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
GOOD = FIXTURES / "harbor"
BAD = FIXTURES / "harbor-bad"


# ---------------------------------------------------------------- loading


def test_the_hand_written_fixtures_load_sorted_with_their_parts() -> None:
    tasks = load_tasks(GOOD)
    assert [t.name for t in tasks] == ["count-timeouts", "csv-summary", "fix-word-count"]
    count = tasks[0]
    assert count.path == GOOD / "count-timeouts"
    assert count.instruction.startswith("# Count the timeouts\n")
    assert count.base_image == "temper-sandbox:latest"
    assert count.dockerfile.startswith("FROM temper-sandbox:latest\n")
    assert count.solution == count.path / "solution" / "solve.sh"
    assert count.tests == count.path / "tests" and count.test_script.is_file()
    assert count.metadata["category"] == "text-processing"


def test_limits_map_to_sandbox_limits() -> None:
    count, summary, words = load_tasks(GOOD)
    # count-timeouts writes the older size strings: memory = "512M", storage = "1G".
    assert count.limits.sandbox() == SandboxLimits(cpus=1.0, memory_mb=512, disk_mb=1024)
    assert count.limits.verifier() == SandboxLimits(
        timeout_s=30.0, cpus=1.0, memory_mb=512, disk_mb=1024
    )
    assert (count.limits.agent_timeout_s, count.limits.build_timeout_s) == (120.0, 300.0)
    assert summary.limits.sandbox() == SandboxLimits(cpus=1.0, memory_mb=1024, disk_mb=128)
    # No build_timeout_sec: Harbor's default.
    assert words.limits.build_timeout_s == 600.0


@pytest.mark.parametrize(
    ("folder", "reason"),
    [
        ("malformed-toml", "task.toml is not valid TOML: Invalid value (at line 4, column 15)"),
        ("missing-test", "tests/test.sh is missing"),
        ("foreign-base", "environment/Dockerfile starts FROM ubuntu:22.04, which cannot be built"),
    ],
)
def test_the_bad_fixtures_are_refused_naming_the_task_and_the_reason(
    folder: str, reason: str
) -> None:
    with pytest.raises(HarborTaskError) as refused:
        load_task(BAD / folder)
    assert refused.value.path == BAD / folder
    assert str(BAD / folder) in str(refused.value) and reason in str(refused.value)


def test_a_folder_of_tasks_names_every_one_refused() -> None:
    with pytest.raises(HarborFolderError) as refused:
        load_tasks(BAD)
    assert [e.path.name for e in refused.value.errors] == [
        "foreign-base",
        "malformed-toml",
        "missing-test",
    ]
    assert "3 of 3 tasks refused" in str(refused.value)
    with pytest.raises(HarborFolderError, match="holds no task folder"):
        load_tasks(GOOD / "count-timeouts" / "environment")


def _toml(path: Path, old: str, new: str) -> None:
    file = path / "task.toml"
    text = file.read_text()
    assert old in text
    file.write_text(text.replace(old, new))


BROKEN: dict[str, tuple[Callable[[Path], object], str]] = {
    "no instruction": (lambda p: (p / "instruction.md").unlink(), "instruction.md is missing"),
    "empty instruction": (lambda p: (p / "instruction.md").write_text(" \n"), "is empty"),
    "binary instruction": (
        lambda p: (p / "instruction.md").write_bytes(b"\xff\xfe"),
        "instruction.md is not UTF-8 text",
    ),
    "no task.toml": (lambda p: (p / "task.toml").unlink(), "task.toml is missing"),
    "no Dockerfile": (
        lambda p: (p / "environment" / "Dockerfile").unlink(),
        "environment/Dockerfile is missing",
    ),
    "no FROM": (
        lambda p: (p / "environment" / "Dockerfile").write_text("# nothing\nWORKDIR /app\n"),
        "environment/Dockerfile has no FROM instruction",
    ),
    "negative timeout": (
        lambda p: _toml(p, "timeout_sec = 30.0", "timeout_sec = -5"),
        "verifier.timeout_sec must be a positive number, not -5",
    ),
    "timeout of a string": (
        lambda p: _toml(p, "timeout_sec = 120.0", 'timeout_sec = "fast"'),
        "agent.timeout_sec must be a number, not 'fast' (str)",
    ),
    "section of a number": (
        lambda p: (
            _toml(p, "[verifier]\ntimeout_sec = 30.0\n", ""),
            _toml(p, 'version = "1.0"', 'version = "1.0"\nverifier = 3'),
        ),
        "[verifier] must be a table, not 3 (int)",
    ),
    "cpus of a boolean": (
        lambda p: _toml(p, "cpus = 1", "cpus = true"),
        "environment.cpus must be a number, not True (bool)",
    ),
    "memory of no size": (
        lambda p: _toml(p, 'memory = "512M"', 'memory = "lots"'),
        "environment.memory must be a size",
    ),
    "memory twice": (
        lambda p: _toml(p, 'memory = "512M"', 'memory = "512M"\nmemory_mb = 512'),
        "environment sets both memory_mb and memory",
    ),
    "a version number": (
        lambda p: _toml(p, 'version = "1.0"', "version = 1.0"),
        "version must be a string",
    ),
    "a GPU": (lambda p: _toml(p, "cpus = 1", "cpus = 1\ngpus = 1"), "needs 1 GPU(s)"),
    "a prebuilt image": (
        lambda p: _toml(p, "cpus = 1", 'cpus = 1\ndocker_image = "python:3.11"'),
        "environment.docker_image (a prebuilt image) is not supported",
    ),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_each_broken_part_is_refused_with_the_path_and_why(tmp_path: Path, case: str) -> None:
    task = tmp_path / "count-timeouts"
    shutil.copytree(GOOD / "count-timeouts", task)
    load_task(task)  # the copy loads before it is broken
    breaks, reason = BROKEN[case]
    breaks(task)
    with pytest.raises(HarborTaskError) as refused:
        load_task(task)
    assert f"task {task}: " in str(refused.value) and reason in str(refused.value)


def test_a_local_image_is_allowed_only_by_name(tmp_path: Path) -> None:
    task = tmp_path / "own-base"
    shutil.copytree(GOOD / "count-timeouts", task)
    dockerfile = task / "environment" / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text().replace("temper-sandbox:latest", "lab/tools:3"))
    with pytest.raises(HarborTaskError, match=r"FROM lab/tools:3, .*\(allowed: none\)"):
        load_task(task)
    assert load_task(task, local_images=["lab/tools:3"]).base_image == "lab/tools:3"
    with pytest.raises(HarborTaskError, match=r"allowed: lab/tools:4"):
        load_task(task, local_images=["lab/tools:4"])


# ---------------------------------------------------------------- the base image


@pytest.mark.parametrize(
    ("base", "allowed"),
    [
        ("temper-sandbox", True),
        ("temper-sandbox:latest", True),
        ("temper-sandbox:3cf716e18e08bf1c", True),
        ("temper-sandbox:v2", False),
        ("temper-sandbox:3CF716E18E08BF1C", False),
        ("temper-sandbox-base:2164b69f0dd1d952", False),
        ("ubuntu:22.04", False),
        ("registry.example/temper-sandbox:latest", False),
        ("scratch", False),
    ],
)
def test_the_sandbox_image_under_build_offline_tags_is_the_base(base: str, allowed: bool) -> None:
    assert base_allowed(base, SANDBOX_IMAGE) is allowed


def test_the_callers_sandbox_image_and_local_images_are_allowed() -> None:
    assert base_allowed("lab/sandbox:x", "lab/sandbox:x")
    assert base_allowed("lab/base", "temper-sandbox:latest", ["lab/base:latest"])
    assert not base_allowed("lab/base:2", "temper-sandbox:latest", ["lab/base"])


@pytest.mark.parametrize(
    ("text", "base"),
    [
        ("FROM temper-sandbox:latest\n", "temper-sandbox:latest"),
        ("# syntax note\n\nfrom temper-sandbox AS env\nRUN true\n", "temper-sandbox"),
        ("FROM --platform=linux/amd64 ubuntu:22.04 AS build\n", "ubuntu:22.04"),
        ("ARG TAG=latest\nFROM temper-sandbox:${TAG}\n", "temper-sandbox:latest"),
        ("ARG BASE\nFROM ${BASE:-temper-sandbox:latest}\n", "temper-sandbox:latest"),
        ("ARG BASE\nFROM $BASE\n", "$BASE"),
        ("FROM \\\n  temper-sandbox:latest\n", "temper-sandbox:latest"),
        ("RUN echo FROM x\n", None),
        ("", None),
    ],
)
def test_the_base_is_the_first_from(text: str, base: str | None) -> None:
    assert dockerfile_base(text) == base


# ---------------------------------------------------------------- the reward


@pytest.mark.parametrize(
    ("files", "reward"),
    [
        ({"reward.txt": b"1\n"}, 1.0),
        ({"reward.txt": b" 0.25 "}, 0.25),
        ({"reward.txt": b"0"}, 0.0),
        ({"reward.txt": b"1e-1"}, 0.1),
        ({"reward.json": b"0.5"}, 0.5),
        ({"reward.json": b'{"reward": 1, "passed": 2}'}, 1.0),
        # As in Harbor, reward.txt wins when both are there.
        ({"reward.txt": b"0.75", "reward.json": b'{"reward": 0.1}'}, 0.75),
        ({"verifier.log": b"1"}, None),
        ({}, None),
    ],
)
def test_reward_of_reads_txt_then_json(files: dict[str, bytes], reward: float | None) -> None:
    assert reward_of(files) == reward


@pytest.mark.parametrize(
    ("files", "reason"),
    [
        ({"reward.txt": b"1.5"}, "reward.txt's reward 1.5 is outside [0, 1]"),
        ({"reward.txt": b"-0.1"}, "outside [0, 1]"),
        ({"reward.txt": b"nan"}, "holds 'nan', not a single number"),
        ({"reward.txt": b"1_0"}, "not a single number"),
        ({"reward.txt": b"1\n0"}, "not a single number"),
        ({"reward.txt": b"passed"}, "holds 'passed', not a single number"),
        ({"reward.txt": b"\n"}, "reward.txt is empty"),
        ({"reward.txt": b"\xff"}, "reward.txt is not UTF-8 text"),
        ({"reward.json": b"NaN"}, "reward.json is not valid JSON: NaN is not a number"),
        ({"reward.json": b"{"}, "reward.json is not valid JSON"),
        ({"reward.json": b'{"score": 1}'}, "reward.json has no 'reward' key (its keys: score)"),
        ({"reward.json": b"true"}, "reward.json's reward is True, not a number"),
        ({"reward.json": b'{"reward": "1"}'}, "reward is '1', not a number"),
        ({"reward.json": b"[1]"}, "reward is [1], not a number"),
        ({"reward.json": b'{"reward": 2}'}, "reward.json's reward 2.0 is outside [0, 1]"),
    ],
)
def test_a_bad_reward_is_an_error_with_the_reason(files: dict[str, bytes], reason: str) -> None:
    with pytest.raises(RewardError) as refused:
        reward_of(files)
    assert reason in str(refused.value)


def test_modes_of_the_fixtures_scripts_let_them_run() -> None:
    for task in load_tasks(GOOD):
        assert task.solution is not None
        assert os.access(task.solution, os.X_OK) and os.access(task.test_script, os.X_OK)
