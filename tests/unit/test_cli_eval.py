"""``temper eval``'s policy argument: a model directory, or a version the learner published."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.cli.common import CliError
from services.cli.evaluate import resolve_policy


def _model(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    return path


def test_a_model_directory_is_taken_as_it_is(tmp_path: Path) -> None:
    model = _model(tmp_path / "policy")
    assert resolve_policy(str(model), tmp_path / "run") == model.resolve()


def test_a_version_names_the_published_weights_of_the_run(tmp_path: Path) -> None:
    run = tmp_path / "run"
    weights = _model(run / "learner" / "weights" / "v12")
    assert resolve_policy("12", run) == weights.resolve()


def test_a_version_no_longer_kept_lists_the_kept_ones(tmp_path: Path) -> None:
    run = tmp_path / "run"
    for version in (11, 12):
        _model(run / "learner" / "weights" / f"v{version}")
    with pytest.raises(CliError, match=r"version 3 .*kept: v11, v12") as error:
        resolve_policy("3", run)
    assert error.value.exit_code == 2


def test_a_directory_without_a_model_is_refused(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(CliError, match="not a model directory"):
        resolve_policy(str(tmp_path / "empty"), tmp_path)
