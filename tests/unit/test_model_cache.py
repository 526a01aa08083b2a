"""Model directories built once per recipe (services/model/cache.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.model.cache import cached_model, recipe_key


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
    assert [p.name for p in cache.iterdir()] == ["policy-abc"], "no build folder left behind"


def test_a_failed_build_leaves_nothing_under_the_name(cache: Path) -> None:
    def build(path: Path) -> None:
        path.mkdir()
        raise RuntimeError("out of memory")

    with pytest.raises(RuntimeError, match="out of memory"):
        cached_model("policy", "abc", build)
    assert list(cache.iterdir()) == []


def test_the_key_follows_the_recipe_and_the_sources(tmp_path: Path) -> None:
    source = tmp_path / "tiny.py"
    source.write_text("A = 1\n")
    key = recipe_key(["tool_use", 80], [source])
    assert recipe_key(["tool_use", 80], [source]) == key
    assert recipe_key(["tool_use", 81], [source]) != key
    source.write_text("A = 2\n")
    assert recipe_key(["tool_use", 80], [source]) != key
