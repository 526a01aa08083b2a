"""Model directories built once per recipe (services/model/cache.py)."""

from __future__ import annotations

import ast
import threading
import time
from pathlib import Path

import pytest

from services.model.cache import BUILDERS, cached_model, recipe_key


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    (tmp_path / "cache").mkdir()
    return tmp_path / "cache"


def test_built_once_then_found(cache: Path) -> None:
    built: list[Path] = []

    def build(path: Path) -> None:
        built.append(path)
        path.mkdir()
        (path / "config.json").write_text("{}")

    first = cached_model("policy", "abc", build)
    second = cached_model("policy", "abc", build)
    assert first == second == cache / "policy-abc" and len(built) == 1
    left = [p.name for p in cache.iterdir() if not p.name.endswith(".lock")]
    assert left == ["policy-abc"], "no build folder left behind"


def test_a_failed_build_leaves_nothing_under_the_name(cache: Path) -> None:
    def build(path: Path) -> None:
        path.mkdir()
        raise RuntimeError("out of memory")

    with pytest.raises(RuntimeError, match="out of memory"):
        cached_model("policy", "abc", build)
    assert [p for p in cache.iterdir() if not p.name.endswith(".lock")] == []


def test_two_builders_at_once_build_once(cache: Path) -> None:
    """The second caller waits for the first one's build and finds it."""
    built: list[str] = []
    started = threading.Event()

    def build(path: Path) -> None:
        built.append(threading.current_thread().name)
        started.set()
        time.sleep(0.3)  # long enough for the other thread to reach the lock
        path.mkdir()
        (path / "config.json").write_text("{}")

    found: list[Path] = []
    first = threading.Thread(target=lambda: found.append(cached_model("policy", "abc", build)))
    first.start()
    assert started.wait(10)
    found.append(cached_model("policy", "abc", build))
    first.join(10)
    assert found == [cache / "policy-abc"] * 2 and len(built) == 1, built


def test_the_key_follows_the_recipe_and_the_sources(tmp_path: Path) -> None:
    source = tmp_path / "tiny.py"
    source.write_text("A = 1\n")
    key = recipe_key(["tool_use", 80], [source])
    assert recipe_key(["tool_use", 80], [source]) == key
    assert recipe_key(["tool_use", 81], [source]) != key
    source.write_text("A = 2\n")
    assert recipe_key(["tool_use", 80], [source]) != key


def test_the_builders_cover_what_they_import_from_the_model_package() -> None:
    """A builder that starts importing another services.model file must name it: a change
    there would otherwise leave stale models under the old keys."""
    names = {path.name for path in BUILDERS}
    for path in BUILDERS:
        imported = [
            node.module
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.ImportFrom) and node.module
        ]
        for module in imported:
            if module.startswith("services.model."):
                assert module.split(".")[-1] + ".py" in names, f"{path.name} imports {module}"
