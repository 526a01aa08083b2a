"""The terminal templates exported as Harbor tasks, without Docker: every one loads back,
the answer key stays under tests/ and solution/, and the exported verifier compares as the
terminal validator does."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from services.cli import main
from services.domains import harbor_check
from services.domains.harbor import SANDBOX_IMAGE, load_task
from services.domains.harbor_export import (
    WORKDIR,
    ExportError,
    export_templates,
    made_for,
)
from services.domains.terminal.base import Made
from services.domains.terminal.family import TEMPLATES
from services.validator.terminal_probes import Probe, holds


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("harbor")
    written = export_templates(folder)
    assert [p.name for p in written] == sorted(TEMPLATES)
    return folder


def files_under(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


def test_every_template_is_exported_and_loads_back(exported: Path) -> None:
    for name in TEMPLATES:
        task = load_task(exported / name)
        assert task.base_image == SANDBOX_IMAGE
        assert task.dockerfile.splitlines()[2] == f"FROM {SANDBOX_IMAGE}"
        assert task.metadata["template"] == name and task.metadata["seed"] == 0
        assert task.solution is not None and task.test_script.is_file()
        assert task.limits.sandbox().memory_mb == 512
        assert task.limits.verifier_timeout_s == 60.0


def test_the_environment_is_exactly_the_templates_files(exported: Path) -> None:
    for name in TEMPLATES:
        made = made_for(name, 0)
        environment = exported / name / "environment"
        found = files_under(environment / "files")
        assert found == {path: text.encode() for path, text in made.files.items()}, name
        assert set(files_under(environment)) == {"Dockerfile", *(f"files/{p}" for p in found)}
        for path in (environment / "files").rglob("*"):
            if path.is_file():  # readable by all, executable by none: as the template starts
                assert stat.S_IMODE(path.stat().st_mode) == 0o644, path


def secrets(made: Made) -> list[str]:
    """What a check expects, and the solution's commands, that the task's files and prompt
    do not already show."""
    shown = made.prompt + "".join(made.files.values())
    found = [made.values, *made.solution]
    for check in made.checks:
        value: Any = check.probe.value
        if isinstance(value, list):
            found.append("\n".join(value))
        elif isinstance(value, dict):
            found.append(json.dumps(value))
        elif isinstance(value, str):
            found.append(value)
        found.append(json.dumps(check.probe.to_metadata()))
    return [s for s in found if s.strip() and s not in shown]


def test_no_answer_in_the_environment_or_the_instruction(exported: Path) -> None:
    for name in TEMPLATES:
        made = made_for(name, 0)
        task = load_task(exported / name)
        seen = task.instruction + "".join(
            data.decode() for data in files_under(task.environment).values()
        )
        assert made.prompt in task.instruction and WORKDIR in task.instruction
        leaked = [s for s in secrets(made) if s in seen]
        assert not leaked, (name, leaked)


def test_the_answer_key_is_in_tests_and_the_oracle_in_solution(exported: Path) -> None:
    for name in TEMPLATES:
        made = made_for(name, 0)
        checks = json.loads((exported / name / "tests" / "checks.json").read_text())
        assert [c["probe"] for c in checks["checks"]] == [
            c.probe.to_metadata() for c in made.checks
        ]
        solve = (exported / name / "solution" / "solve.sh").read_text()
        assert solve.startswith("#!/bin/bash\n") and f"cd {WORKDIR} || exit 1\n" in solve
        assert solve.endswith("\n".join(made.solution) + "\n")
        copied = (exported / name / "tests" / "check.py").read_text()
        assert copied == Path(harbor_check.__file__).read_text()
        for script in ("solution/solve.sh", "tests/test.sh"):
            assert os.access(exported / name / script, os.X_OK)


def test_an_export_that_cannot_be_done_writes_nothing(tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="unknown terminal template 'nope'; known: archive"):
        export_templates(tmp_path, ["crlf", "nope"])
    with pytest.raises(ExportError, match=r"FROM ubuntu:22\.04, which cannot be built"):
        export_templates(tmp_path, ["crlf"], base="ubuntu:22.04")
    assert list(tmp_path.iterdir()) == []
    export_templates(tmp_path, ["crlf"], base="temper-sandbox:3cf716e18e08bf1c")
    assert (
        "FROM temper-sandbox:3cf716e18e08bf1c\n"
        in (tmp_path / "crlf/environment/Dockerfile").read_text()
    )
    with pytest.raises(ExportError, match=r"task folders already exist: .*/crlf"):
        export_templates(tmp_path, ["archive", "crlf"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["crlf"]


def test_the_cli_exports_and_says_what_is_wrong(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "tasks"
    argv = ["domains", "export", "--harbor", str(target), "--template", "crlf", "archive"]
    assert main([*argv, "--seed", "3"]) == 0
    assert capsys.readouterr().out.split() == [str(target / "crlf"), str(target / "archive")]
    assert load_task(target / "crlf").metadata["seed"] == 3
    assert main(argv) == 2
    assert "task folders already exist" in capsys.readouterr().err
    assert main(["domains", "export", "--template", "crlf"]) == 2
    assert "usage: temper domains export --harbor DIR" in capsys.readouterr().err
    assert main(["domains", "--harbor", str(tmp_path / "x")]) == 2
    assert main(["domains", "export", "--harbor", str(tmp_path / "y"), "--template", "x"]) == 2
    assert "unknown terminal template 'x'" in capsys.readouterr().err


# ---------------------------------------------------------------- the exported verifier

OBSERVATIONS: list[tuple[str, Any, str | None]] = [
    ("ok", None, ""),
    ("ok", None, None),
    ("text", "42", " 42\n"),
    ("text", "42", "4 2"),
    ("text", 42, "42"),
    ("lines", ["a", "b"], "a  \nb\n\n"),
    ("lines", ["a", "b"], "b\na\n"),
    ("json", {"a": [1, 2]}, '{"a": [1, 2]}'),
    ("json", {"a": 1}, "{not json"),
    ("json", {"a": 1}, "[" * 5000),
    ("pairs", {"K": "v", "N": "1"}, "K=v\nN=1 junk\n"),
    ("pairs", {"K": "v"}, "K=w"),
    ("lacks", "\r", "a,b\n"),
    ("lacks", "\r", "a,b\r\n"),
    ("lacks", 5, "anything"),
]


@pytest.mark.parametrize(("expect", "value", "seen"), OBSERVATIONS)
def test_the_exported_verifier_compares_as_the_validator(
    expect: str, value: Any, seen: str | None
) -> None:
    probe = Probe(run="true", read=None, expect=expect, value=value)
    assert harbor_check.holds(expect, value, seen) == holds(probe, seen)
    assert set(harbor_check.COMPARE) == {"ok", "text", "lines", "json", "pairs", "lacks"}


def test_the_exported_verifier_reads_no_symlink_fifo_or_oversized_file(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.txt").write_text("hello")
    (tmp_path / "big.txt").write_text("x" * 11)
    (tmp_path / "link.txt").symlink_to(tmp_path / "sub" / "a.txt")
    (tmp_path / "linked").symlink_to(tmp_path / "sub")
    os.mkfifo(tmp_path / "fifo")
    read = harbor_check.read_regular
    assert read(tmp_path, "sub/a.txt", 10) == "hello"
    assert read(tmp_path, "big.txt", 10) is None
    for path in ("link.txt", "linked/a.txt", "fifo", "sub", "missing.txt"):
        assert read(tmp_path, path, 10) is None, path


def test_the_exported_verifier_writes_the_share_passed_or_nothing(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "answer.txt").write_text("7\n")
    checks = [
        {
            "name": "right",
            "message": "m",
            "probe": {"read": "answer.txt", "expect": "text", "value": "7"},
        },
        {
            "name": "wrong",
            "message": "m",
            "probe": {"read": "answer.txt", "expect": "text", "value": "8"},
        },
    ]
    spec = tmp_path / "checks.json"
    spec.write_text(json.dumps({"timeout_s": 5, "output_bytes": 100, "checks": checks}))
    reward = tmp_path / "logs" / "reward.txt"
    assert harbor_check.main(["check.py", str(spec), str(work), str(reward)]) == 0
    assert reward.read_text() == "0.5\n"
    reward.unlink()
    spec.write_text(json.dumps({"timeout_s": 5, "output_bytes": 100, "checks": []}))
    assert harbor_check.main(["check.py", str(spec), str(work), str(reward)]) == 2
    spec.write_text("{")
    assert harbor_check.main(["check.py", str(spec), str(work), str(reward)]) == 2
    assert not reward.exists()
