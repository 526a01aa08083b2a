"""The rooms of ``services/`` keep to themselves (docs/architecture.md).

- A service package (every built-in service of the registry, those on request included)
  imports no other service's package, except that service's bus client
  (``services.<service>.client``): services talk over NATS, never through each other's code.
- A shared room (runtime, model, engines, domains, evaluation) imports no service and no
  top room: it is what the services are built from.
- The top rooms (the CLI, the supervisor, the registry) start services and may import any.
- Every package under ``services/`` is in one of these lists, so a new one is placed on purpose.
- No engine file is over ``MAX_ENGINE_LINES`` lines.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from services.registry import BUILTIN, ON_REQUEST

ROOT = Path(__file__).resolve().parents[2] / "services"
BUILT_IN = [*BUILTIN.values(), *(entry for entry, _ in ON_REQUEST.values())]
SERVICES = frozenset(entry.target.split(":")[0].split(".")[1] for entry in BUILT_IN)
SHARED = frozenset({"runtime", "model", "engines", "domains", "evaluation"})
TOP = frozenset({"cli", "supervisor", "registry", "__main__"})
#: The one module of a service that others may import: its client over the bus.
PUBLIC = "client"
MAX_ENGINE_LINES = 650


def room_of(path: Path) -> str:
    """The room of ``services/<room>/...`` or ``services/<room>.py`` (a repository path)."""
    parts = path.parts[1:]
    return parts[0] if len(parts) > 1 else path.stem


def imported(path: Path, source: str) -> Iterator[tuple[int, str]]:
    """(line, dotted module) of every import in ``source`` (the text of repository path
    ``path``), relative ones resolved and ``from services import x`` read as ``services.x``."""
    package = list(path.with_suffix("").parts[:-1])
    for node in ast.walk(ast.parse(source, filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            yield node.lineno, module
            for alias in node.names:
                yield node.lineno, f"{module}.{alias.name}"


def violations(path: Path, source: str) -> list[str]:
    """Each import of ``source`` (repository path ``path``) that crosses a wall, as
    ``path:line imports module``."""
    room = room_of(path)
    found: list[str] = []
    for line, module in imported(path, source):
        parts = module.split(".")
        if parts[0] != "services" or len(parts) < 2 or parts[1] == room:
            continue
        target = parts[1]
        if room in SERVICES:
            crossing = target in SERVICES and parts[2:3] != [PUBLIC]
            crossing = crossing or target in TOP
        elif room in SHARED:
            crossing = target in SERVICES or target in TOP
        else:
            crossing = False
        if crossing:
            found.append(f"{path}:{line} imports {module}")
    return found


def python_files() -> list[Path]:
    """Every module under ``services/``, as a repository path."""
    found = (p for p in ROOT.rglob("*.py") if "__pycache__" not in p.parts)
    return sorted(p.relative_to(ROOT.parent) for p in found)


def test_every_room_is_placed() -> None:
    rooms = {room_of(p) for p in python_files()} - {"__init__"}
    unplaced = rooms - SERVICES - SHARED - TOP
    assert not unplaced, f"rooms in no list of tests/unit/test_rooms.py: {sorted(unplaced)}"
    assert not SERVICES & (SHARED | TOP)


def test_no_service_imports_another_service() -> None:
    crossings = [v for p in python_files() for v in violations(p, (ROOT.parent / p).read_text())]
    assert not crossings, "imports across rooms:\n" + "\n".join(crossings)


def test_a_crossing_is_named() -> None:
    """The check itself: a learner module reaching into the generator is caught and named,
    while the sandbox's client and the shared rooms are not."""
    source = (
        "from services.generator.agent import AgentLoop\n"
        "from services.sandbox.client import SandboxClient\n"
        "from ..generator import service\n"
        "from services import replay\n"
        "from services.engines.sglang.broadcast import GlooWeightSender\n"
        "from .ranks import Ranks\n"
    )
    found = violations(Path("services/learner/_probe.py"), source)
    assert found == [
        "services/learner/_probe.py:1 imports services.generator.agent",
        "services/learner/_probe.py:1 imports services.generator.agent.AgentLoop",
        "services/learner/_probe.py:3 imports services.generator",
        "services/learner/_probe.py:3 imports services.generator.service",
        "services/learner/_probe.py:4 imports services.replay",
    ]


def test_engine_files_stay_small() -> None:
    engines = [p for p in python_files() if room_of(p) == "engines"]
    assert engines
    long = {
        str(p): n
        for p in engines
        if (n := len((ROOT.parent / p).read_text().splitlines())) > MAX_ENGINE_LINES
    }
    assert not long, f"engine files over {MAX_ENGINE_LINES} lines (split them): {long}"
