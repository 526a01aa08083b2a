"""Harbor task folders: load and check them, and read the reward their verifier writes.

Harbor's task format is the common currency of SkyRL, rllm, TRL's OpenEnv harness and
tinker-cookbook.  A task is a folder::

    task.toml              limits and free-form metadata (services/domains/harbor_toml.py)
    instruction.md         what the agent is asked to do
    environment/Dockerfile the image the agent works in (its folder is the build context)
    solution/solve.sh      optional: the oracle, run where the agent would work
    tests/test.sh          the verifier: run after the agent, it writes
                           /logs/verifier/reward.txt (a number) or reward.json

Temper builds no image from a registry, so a task's Dockerfile must start ``FROM`` the
sandbox image (``temper-sandbox``, tagged ``latest`` or by content hash as
deploy/sandbox/build-offline.sh does) or from a local image the caller allows by name.
Everything is checked at load; a task that fails any check is refused with its path and
the reason, never half-loaded.  The reward is checked when read: a verifier that writes
no reward, or one outside [0, 1], is the caller's ``invalid``, never a score.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from services.domains.api import DomainError
from services.domains.harbor_toml import HarborLimits, TomlProblem, parse_task_toml

TASK_TOML: Final = "task.toml"
INSTRUCTION: Final = "instruction.md"
DOCKERFILE: Final = "environment/Dockerfile"
TEST_SCRIPT: Final = "tests/test.sh"
SOLUTION_SCRIPT: Final = "solution/solve.sh"
#: Where the verifier writes its reward, inside the task's container.
VERIFIER_DIR: Final = "/logs/verifier"
REWARD_TXT: Final = "reward.txt"
REWARD_JSON: Final = "reward.json"
#: The sandbox image's repository, as deploy/sandbox/build-offline.sh names it (``IMAGE``).
SANDBOX_REPOSITORY: Final = "temper-sandbox"
SANDBOX_IMAGE: Final = f"{SANDBOX_REPOSITORY}:latest"
#: build-offline.sh's tags: ``latest`` and a 16-digit content hash.
_SANDBOX_TAG: Final = re.compile(r"^(latest|[0-9a-f]{16})$")
_NUMBER: Final = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")
_VARIABLE: Final = re.compile(r"\$(\w+)|\$\{(\w+)(?::-([^}]*))?\}")


class HarborTaskError(DomainError):
    """A task folder that cannot be used: its path and the reason."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__("harbor", f"task {path}: {reason}")
        self.path = path
        self.reason = reason


class HarborFolderError(DomainError):
    """A folder of tasks that cannot be used: each refused task is in ``errors``."""

    def __init__(self, folder: Path, reason: str, errors: list[HarborTaskError]) -> None:
        super().__init__("harbor", f"tasks folder {folder}: {reason}")
        self.folder = folder
        self.errors = errors


class RewardError(ValueError):
    """The verifier's reward file cannot be read as a reward in [0, 1] (the rollout is invalid)."""


@dataclass(frozen=True, kw_only=True)
class HarborTask:
    """One checked task folder."""

    path: Path
    #: The folder's name.
    name: str
    instruction: str
    limits: HarborLimits
    #: task.toml's ``[metadata]`` table, as it is.
    metadata: Mapping[str, Any]
    dockerfile: str
    #: The image of the Dockerfile's first ``FROM``.
    base_image: str
    #: ``solution/solve.sh``, when the task has an oracle.
    solution: Path | None
    #: The ``tests/`` folder (copied to ``/tests`` and run as ``bash /tests/test.sh``).
    tests: Path

    @property
    def environment(self) -> Path:
        """The Dockerfile's build context."""
        return self.path / "environment"

    @property
    def test_script(self) -> Path:
        return self.path / TEST_SCRIPT


def load_task(
    path: Path | str,
    *,
    sandbox_image: str = SANDBOX_IMAGE,
    local_images: Collection[str] = (),
) -> HarborTask:
    """The task in folder ``path``, checked; :class:`HarborTaskError` names what is wrong."""
    folder = Path(path)
    if not folder.is_dir():
        raise HarborTaskError(folder, "is not a folder")
    try:
        parsed = parse_task_toml(_text(folder, TASK_TOML))
    except TomlProblem as problem:
        raise HarborTaskError(folder, str(problem)) from None
    instruction = _text(folder, INSTRUCTION)
    if not instruction.strip():
        raise HarborTaskError(folder, f"{INSTRUCTION} is empty")
    if not (folder / TEST_SCRIPT).is_file():
        raise HarborTaskError(
            folder, f"{TEST_SCRIPT} is missing (the verifier that writes the reward)"
        )
    dockerfile = _text(folder, DOCKERFILE)
    base = dockerfile_base(dockerfile)
    if base is None:
        raise HarborTaskError(folder, f"{DOCKERFILE} has no FROM instruction")
    if not base_allowed(base, sandbox_image, local_images):
        raise HarborTaskError(folder, base_refusal(base, sandbox_image, local_images))
    solution = folder / SOLUTION_SCRIPT
    return HarborTask(
        path=folder,
        name=folder.name,
        instruction=instruction,
        limits=parsed.limits,
        metadata=parsed.metadata,
        dockerfile=dockerfile,
        base_image=base,
        solution=solution if solution.is_file() else None,
        tests=folder / "tests",
    )


def load_tasks(
    folder: Path | str,
    *,
    sandbox_image: str = SANDBOX_IMAGE,
    local_images: Collection[str] = (),
) -> list[HarborTask]:
    """Every task of ``folder``, sorted by name; :class:`HarborFolderError` names each one
    refused.  A sub-folder with a task.toml or an instruction.md is a task (one with only
    the latter is refused for its missing task.toml); other sub-folders are not tasks."""
    root = Path(folder)
    if not root.is_dir():
        raise HarborFolderError(root, "is not a folder", [])
    candidates = sorted(
        (p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".") and _a_task(p)),
        key=lambda p: p.name,
    )
    if not candidates:
        raise HarborFolderError(root, f"holds no task folder (a sub-folder with {TASK_TOML})", [])
    tasks, errors = [], []
    for candidate in candidates:
        try:
            tasks.append(
                load_task(candidate, sandbox_image=sandbox_image, local_images=local_images)
            )
        except HarborTaskError as error:
            errors.append(error)
    if errors:
        said = "; ".join(f"{e.path.name}: {e.reason}" for e in errors)
        raise HarborFolderError(
            root, f"{len(errors)} of {len(candidates)} tasks refused: {said}", errors
        )
    return tasks


def _a_task(folder: Path) -> bool:
    return (folder / TASK_TOML).exists() or (folder / INSTRUCTION).exists()


def _text(folder: Path, name: str) -> str:
    file = folder / name
    if not file.exists():
        raise HarborTaskError(folder, f"{name} is missing")
    if not file.is_file():
        raise HarborTaskError(folder, f"{name} is not a file")
    try:
        return file.read_bytes().decode("utf-8")
    except UnicodeDecodeError as error:
        raise HarborTaskError(folder, f"{name} is not UTF-8 text ({error.reason})") from None
    except OSError as error:
        raise HarborTaskError(folder, f"{name} cannot be read ({error.strerror})") from None


# ---------------------------------------------------------------- the Dockerfile's base


def dockerfile_base(text: str) -> str | None:
    """The image of the first ``FROM`` (its flags and ``AS`` name left out, the ``ARG``
    defaults declared before it substituted), or None when there is no ``FROM``."""
    args: dict[str, str] = {}
    for keyword, rest in dockerfile_instructions(text):
        if keyword == "ARG":
            name, has_default, default = rest.partition("=")
            if has_default:
                args[name.strip()] = default.strip().strip("\"'")
        elif keyword == "FROM":
            words = [w for w in rest.split() if not w.startswith("--")]
            return _substituted(words[0], args) if words else None
    return None


def dockerfile_instructions(text: str) -> Iterator[tuple[str, str]]:
    """(KEYWORD, the rest) of each instruction: comments dropped, continuations joined."""
    logical: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue  # Docker drops comment and blank lines, inside a continuation too
        if stripped.endswith("\\"):
            logical.append(stripped[:-1])
            continue
        logical.append(stripped)
        keyword, _, rest = " ".join(logical).partition(" ")
        logical = []
        yield keyword.upper(), rest.strip()
    if logical:
        keyword, _, rest = " ".join(logical).partition(" ")
        yield keyword.upper(), rest.strip()


def _substituted(word: str, args: Mapping[str, str]) -> str:
    def value(match: re.Match[str]) -> str:
        name = match[1] or match[2]
        if args.get(name):
            return args[name]
        return match[3] if match[3] is not None else match[0]

    return _VARIABLE.sub(value, word)


def _normal(image: str) -> str:
    """``name`` means ``name:latest``; a digest or a tag is kept."""
    last = image.rsplit("/", 1)[-1]
    return image if ":" in last or "@" in last else f"{image}:latest"


def is_sandbox_image(image: str) -> bool:
    """The sandbox image under one of the tags build-offline.sh gives it."""
    repository, _, tag = _normal(image).rpartition(":")
    return repository == SANDBOX_REPOSITORY and bool(_SANDBOX_TAG.match(tag))


def base_allowed(
    dockerfile_base: str, sandbox_base: str, local_images: Collection[str] = ()
) -> bool:
    """Whether a task image can be built offline from ``dockerfile_base``: it is the
    sandbox image (``sandbox_base``, or a tag of build-offline.sh's scheme) or one of the
    ``local_images`` the caller allows."""
    base = _normal(dockerfile_base)
    if base == _normal(sandbox_base) or is_sandbox_image(base):
        return True
    return base in {_normal(image) for image in local_images}


def base_refusal(
    dockerfile_base: str, sandbox_base: str, local_images: Collection[str] = ()
) -> str:
    """Why ``dockerfile_base`` is refused, naming what would be allowed."""
    allowed = ", ".join(sorted(local_images)) or "none"
    return (
        f"{DOCKERFILE} starts FROM {dockerfile_base}, which cannot be built here: a task "
        f"image must start FROM the sandbox image ({sandbox_base}, or {SANDBOX_REPOSITORY}:"
        f"<content hash> as deploy/sandbox/build-offline.sh tags it) or from a local image "
        f"allowed by name (allowed: {allowed})"
    )


# ---------------------------------------------------------------- the reward


def reward_of(files: Mapping[str, bytes]) -> float | None:
    """The reward in the verifier's files (names under /logs/verifier), or None when it
    wrote neither ``reward.txt`` nor ``reward.json``.  ``reward.txt`` (one number) wins
    over ``reward.json`` (a number, or an object whose ``reward`` key is one), as in
    Harbor.  Nothing is clamped: a value outside [0, 1], NaN, or anything that is not a
    number raises :class:`RewardError` with the reason."""
    if REWARD_TXT in files:
        return _in_range(REWARD_TXT, _txt_reward(files[REWARD_TXT]))
    if REWARD_JSON in files:
        return _in_range(REWARD_JSON, _json_reward(files[REWARD_JSON]))
    return None


def _decoded(name: str, data: bytes) -> str:
    try:
        return data.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise RewardError(f"{name} is not UTF-8 text") from None


def _txt_reward(data: bytes) -> float:
    text = _decoded(REWARD_TXT, data)
    if not text:
        raise RewardError(f"{REWARD_TXT} is empty")
    if not _NUMBER.match(text):
        raise RewardError(f"{REWARD_TXT} holds {_clip(text)!r}, not a single number")
    return float(text)


def _json_reward(data: bytes) -> float:
    text = _decoded(REWARD_JSON, data)
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except (json.JSONDecodeError, RewardError) as error:
        raise RewardError(f"{REWARD_JSON} is not valid JSON: {error}") from None
    if isinstance(value, dict):
        if "reward" not in value:
            keys = ", ".join(map(str, value)) or "none"
            raise RewardError(f"{REWARD_JSON} has no 'reward' key (its keys: {keys})")
        value = value["reward"]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RewardError(f"{REWARD_JSON}'s reward is {_clip(repr(value))}, not a number")
    return float(value)


def _no_constant(name: str) -> float:
    raise RewardError(f"{name} is not a number")


def _in_range(name: str, value: float) -> float:
    if math.isnan(value):
        raise RewardError(f"{name}'s reward is NaN")
    if not 0.0 <= value <= 1.0:
        raise RewardError(f"{name}'s reward {value} is outside [0, 1]")
    return value


def _clip(text: str, size: int = 60) -> str:
    return text if len(text) <= size else text[:size] + "..."
