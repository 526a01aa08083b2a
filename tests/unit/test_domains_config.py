"""Domains from TOML: families, overrides, datasets, plugins, and errors that say where."""

from __future__ import annotations

import json
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any

import pytest

from services.domains import ConfigError, Domain, DomainError, ValidatorSpec, load_registry
from services.domains import registry as domain_registry
from services.domains.arithmetic import domain as arithmetic_domain

REPO = Path(__file__).resolve().parents[2]


ARITHMETIC = '[[domain]]\nname = "x"\nkind = "arithmetic"'
PATH_PARAM = 'params = { path = "data/capitals.jsonl" }'


def toml(*lines: str) -> str:
    return "\n".join(lines) + "\n"


def write(tmp_path: Path, text: str, name: str = "domains.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def custom_kind(name: str, params: dict[str, Any]) -> Domain:
    """A plugin kind, named ``tests.unit.test_domains_config:custom_kind`` in configs."""
    return arithmetic_domain(name, {"op": "mul", **params})


PLUGIN_DOMAINS = [arithmetic_domain("plugged-a", {}), arithmetic_domain("plugged-b", {"op": "sub"})]


def test_the_deploy_config_declares_more_than_200_domains() -> None:
    registry = load_registry(REPO / "deploy" / "domains", plugins=False)
    assert len(registry) >= 200
    kinds = {domain.kind for domain in registry}
    assert kinds == {
        "arithmetic",
        "word_problems",
        "python_functions",
        "doc_qa",
        "tool_use",
        "jsonl",
        "compiled_functions",
        "documents",
        "cad_parts",
        "terminal",
        "reasoning_gym",
    }
    documents = [d.name for d in registry if d.kind == "documents"]
    assert len(documents) == 24  # 6 question kinds x pdf/html x short/long
    for domain in registry:  # every domain can serve both splits
        assert domain.make_tasks(1, "train") and domain.make_tasks(1, "eval")


def test_a_family_expands_over_its_matrix(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        [[family]]
        name = "a-{op}-{digits}"
        kind = "arithmetic"
        matrix = { op = ["add", "mul"], digits = [1, 2, 3] }
        params = { style = "boxed" }
        max_tokens = 32
        """,
    )
    registry = load_registry(path, plugins=False)
    assert registry.names() == [f"a-{op}-{d}" for op in ("add", "mul") for d in (1, 2, 3)]
    domain = registry.get("a-mul-3")
    assert domain.source.op == "mul" and domain.source.digits == 3  # type: ignore[attr-defined]
    assert domain.validators[0].params == {"extract": "boxed"}
    assert domain.max_tokens == 32
    assert "arithmetic" not in registry  # built-ins only when asked for


def test_overrides_and_defaults(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        include_builtins = true
        [defaults]
        samples = 4
        tier = 0
        [[domain]]
        name = "strict"
        kind = "arithmetic"
        prompt = { system = "Just the number." }
        tools = ["python"]
        sandbox = { timeout_s = 2.5 }
        eval_fraction = 0.5
        pass_threshold = 0.9
        validators = [
          { kind = "math", weight = 0.8, params = { extract = "tag" } },
          { kind = "length", weight = 0.2, name = "brevity", params = { limit = 20 } },
        ]
        """,
    )
    registry = load_registry(path, plugins=False)
    strict = registry.get("strict")
    assert strict.prompt.system == "Just the number." and strict.prompt.template == "{question}="
    assert (strict.samples, strict.tier, strict.eval_fraction, strict.pass_threshold) == (
        4,
        0,
        0.5,
        0.9,
    )
    assert (
        strict.tools == ("python",)
        and strict.sandbox is not None
        and strict.sandbox.timeout_s == 2.5
    )
    assert strict.validators == (
        ValidatorSpec(kind="math", weight=0.8, params={"extract": "tag"}),
        ValidatorSpec(kind="length", weight=0.2, params={"limit": 20}, name="brevity"),
    )
    assert registry.names()[:7] == [
        "arithmetic",
        "arithmetic_sum3",
        "arithmetic_sum4",
        "math_word_problems",
        "python_functions",
        "doc_numeric_qa",
        "tool_use",
    ]
    assert strict.make_tasks(1)[0].n == 4


def test_a_folder_loads_every_file_and_jsonl_paths_are_relative(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    lines = [
        {"id": "q1", "question": "Capital of France?", "answer": "Paris", "split": "eval"},
        {"id": "q2", "question": "Capital of Italy?", "answer": "Rome", "split": "train"},
        {"question": "Capital of Spain?", "answer": "Madrid", "metadata": {"region": "EU"}},
    ]
    (data / "capitals.jsonl").write_text("\n".join(json.dumps(line) for line in lines) + "\n\n")
    write(
        tmp_path,
        toml("[[domain]]", 'name = "capitals"', 'kind = "jsonl"', PATH_PARAM),
        "a.toml",
    )
    write(tmp_path, '[[domain]]\nname = "adds"\nkind = "arithmetic"\n', "b.toml")
    registry = load_registry(tmp_path, plugins=False)
    assert registry.names() == ["capitals", "adds"]
    capitals = registry.get("capitals")
    held_out = {t.metadata["answer"] for t in capitals.make_tasks(20, "eval")}
    train = {t.metadata["answer"] for t in capitals.make_tasks(20, "train")}
    # Explicit splits are kept; the line without one goes where its id's hash says.
    assert "Paris" in held_out and "Rome" in train and not held_out & train
    assert held_out | train == {"Paris", "Rome", "Madrid"}
    assert capitals.validators[0].kind == "exact"


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("[[domain]\nname=", "not valid TOML"),
        ('[[domain]]\nname = "x"\n', "missing required field `kind`"),
        (
            '[[domain]]\nname = "x"\nkind = "arithmetic"\nmax_token = 3\n',
            "unknown field `max_token`",
        ),
        (
            '[[domain]]\nname = "x"\nkind = "arithmetic"\nmax_tokens = "3"\n',
            "Expected `int | null`, got `str`",
        ),
        ('[[domain]]\nname = "x"\nkind = "cooking"\n', "unknown kind"),
        (
            '[[domain]]\nname = "x"\nkind = "arithmetic"\nparams = { digit = 2 }\n',
            "unknown parameters ['digit']",
        ),
        (
            '[[domain]]\nname = "x"\nkind = "arithmetic"\nparams = { digits = 99 }\n',
            "parameter 'digits'",
        ),
        ('[[domain]]\nname = "a b"\nkind = "arithmetic"\n', "subject token"),
        (
            '[[domain]]\nname = "x"\nkind = "arithmetic"\nsandbox = { timeout_s = -1 }\n',
            "timeout_s",
        ),
        (
            '[[domain]]\nname = "x"\nkind = "arithmetic"\nsandbox = { memroy_mb = 64 }\n',
            "domain 'x': unknown sandbox limit memroy_mb (known: timeout_s, memory_mb",
        ),
        (
            '[defaults]\nsandbox = { pid = 8 }\n[[domain]]\nname = "x"\nkind = "arithmetic"\n',
            "unknown sandbox limit pid",
        ),
        (
            '[[domain]]\nname = "x"\nkind = "arithmetic"\nretry = { max_atempts = 2 }\n',
            "domain 'x': retry: Object contains unknown field `max_atempts`",
        ),
        (
            '[[domain]]\nname = "x"\nkind = "arithmetic"\nretry = { on = ["answer"] }\n',
            "Invalid enum value 'answer'",
        ),
        (
            '[[domain]]\nname = "x"\nkind = "arithmetic"\nretry = { max_attempts = 0 }\n',
            "max_attempts must be at least 1",
        ),
        (
            '[[domain]]\nname = "x"\nkind = "jsonl"\nparams = { path = "missing.jsonl" }\n',
            "cannot read dataset",
        ),
        (
            '[[family]]\nname = "f-{nope}"\nkind = "arithmetic"\nmatrix = { op = ["add"] }\n',
            "name template",
        ),
        (
            toml(*[ARITHMETIC] * 2),
            "declared twice",
        ),
        ("colour = 1\n", "unknown field `colour`"),
    ],
)
def test_config_errors_name_the_file_and_the_problem(tmp_path: Path, text: str, error: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises((ConfigError, DomainError)) as caught:
        load_registry(path, plugins=False)
    assert error in str(caught.value)
    if isinstance(caught.value, ConfigError):
        assert caught.value.path == path


def test_a_missing_config_file_or_an_empty_folder_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_registry(tmp_path / "absent.toml")
    with pytest.raises(ConfigError, match=r"no \*\.toml files"):
        load_registry(tmp_path)


def test_bad_jsonl_lines_are_reported_with_their_line(tmp_path: Path) -> None:
    (tmp_path / "d.jsonl").write_text('{"question": "q", "answer": "a"}\nnot json\n')
    path = write(
        tmp_path, '[[domain]]\nname = "x"\nkind = "jsonl"\nparams = { path = "d.jsonl" }\n'
    )
    with pytest.raises(ConfigError, match=r"d\.jsonl:2: not JSON"):
        load_registry(path, plugins=False)


def test_module_factory_kinds(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        toml(
            "[[domain]]",
            'name = "x"',
            'kind = "tests.unit.test_domains_config:custom_kind"',
            "params = { digits = 2 }",
        ),
    )
    domain = load_registry(path, plugins=False).get("x")
    assert (domain.source.op, domain.source.digits) == ("mul", 2)  # type: ignore[attr-defined]


def test_entry_point_plugins_add_domains(monkeypatch: pytest.MonkeyPatch) -> None:
    points = [
        EntryPoint(
            name="many",
            value="tests.unit.test_domains_config:PLUGIN_DOMAINS",
            group="temper.domains",
        ),
        EntryPoint(
            name="one", value="tests.unit.test_domains_config:custom_domain", group="temper.domains"
        ),
    ]

    def entry_points(*, group: str) -> list[EntryPoint]:
        return points if group == "temper.domains" else []

    monkeypatch.setattr(domain_registry, "entry_points", entry_points)
    registry = load_registry(None)
    assert registry.names()[-3:] == ["plugged-a", "plugged-b", "plugged-c"]
    assert "plugged-a" not in load_registry(None, plugins=False)


def custom_domain() -> Domain:
    return arithmetic_domain("plugged-c", {"op": "mixed"})
