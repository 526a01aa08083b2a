"""The ``temper`` command line without a server: argument parsing, task files, early errors."""

from __future__ import annotations

import io
import json
import os
import re
from pathlib import Path

import pytest

from protocol.messages import (
    ChatMessage,
    DomainSchedule,
    DomainSchedules,
    SamplingParams,
    Task,
    TenantSchedule,
)
from protocol.packed import pack_i32
from services import registry
from services.cli import build_parser, main
from services.cli.common import CliError
from services.cli.domain_control import describe
from services.cli.messages import parse_task, read_tasks

COMMANDS = (
    "up",
    "serve",
    "status",
    "check",
    "submit",
    "tail",
    "record",
    "replay",
    "dlq",
    "sandbox",
    "domains",
    "domain",
    "model",
    "ledger",
    "report",
    "eval",
    "train",
)
HEX_ID = re.compile(r"^[0-9a-f]{32}$")


# ---------------------------------------------------------------- parse_task


def test_prompt_string_becomes_one_user_message_and_an_id_is_made() -> None:
    task = parse_task('{"domain": "math", "prompt": "2 + 2?"}', 1)
    assert task.prompt == [ChatMessage(role="user", content="2 + 2?")]
    assert task.domain == "math"
    assert HEX_ID.match(task.id)
    assert parse_task('{"domain": "math", "prompt": "x"}', 1).id != task.id


def test_explicit_fields_are_kept() -> None:
    line = json.dumps(
        {
            "type": "task",
            "id": "add-1",
            "domain": "arithmetic",
            "tier": 0,
            "prompt": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "1+1"},
            ],
            "n": 8,
            "sampling": {"temperature": 0.5, "max_tokens": 16},
            "metadata": {"answer": "2"},
        }
    )
    task = parse_task(line, 1)
    assert task == Task(
        id="add-1",
        domain="arithmetic",
        tier=0,
        prompt=[
            ChatMessage(role="system", content="be brief"),
            ChatMessage(role="user", content="1+1"),
        ],
        n=8,
        sampling=SamplingParams(temperature=0.5, max_tokens=16),
        metadata={"answer": "2"},
    )


def test_a_tenant_is_read_and_none_is_the_default_tenant() -> None:
    assert parse_task('{"domain": "math", "prompt": "x", "tenant": "acme"}', 1).tenant == "acme"
    assert parse_task('{"domain": "math", "prompt": "x"}', 1).tenant == ""


def test_domain_status_lists_the_tenants_of_a_domain_that_has_them() -> None:
    tenants = [TenantSchedule(tenant="", started=2), TenantSchedule(tenant="acme", started=9)]
    answer = DomainSchedules(
        instance="g1",
        domains=[
            DomainSchedule(domain="maths", started=11, in_flight=1, tenants=tenants),
            DomainSchedule(domain="code", started=3),
        ],
    )
    lines = describe([answer])
    assert [line.split()[:3] for line in lines[1:]] == [
        ["maths", "active", "weight"],
        ["(default", "tenant)", "started"],
        ["acme", "started", "9"],
        ["code", "active", "weight"],
    ]
    # The tenants' counts line up under their domain's.
    assert {line.index("started") for line in lines[1:]} == {lines[1].index("started")}


def test_prompt_tokens_list_is_packed() -> None:
    task = parse_task('{"id": "tok", "domain": "math", "prompt_tokens": [1, 2, -3, 2147483647]}', 1)
    assert task.prompt_tokens == pack_i32([1, 2, -3, 2**31 - 1])
    assert task.prompt == []


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("{not json", "line 4: not JSON"),
        ("[1, 2]", "line 4: expected a JSON object, got list"),
        ('"just a string"', "line 4: expected a JSON object, got str"),
        (
            '{"prompt": "x"}',
            "line 4: invalid task: Object missing required field `domain` (at $.domain)",
        ),
        ('{"domain": "math", "prompt": "x", "n": 0}', "(at $.n)"),
        ('{"domain": "math", "prompt": "x", "n": "8"}', "Expected `int`, got `str` (at $.n)"),
        ('{"domain": "two words", "prompt": "x"}', "(at $.domain)"),
        ('{"domain": "math", "prompt": "x", "tenant": "a.b"}', "(at $.tenant)"),
        ('{"domain": "math", "prompt": "x", "tier": 9}', "(at $.tier)"),
        ('{"domain": "math", "prompt": "x", "sampling": {"top_p": 0}}', "(at $.sampling.top_p)"),
        (
            '{"domain": "math", "prompt": [{"role": "robot", "content": "x"}]}',
            "(at $.prompt[0].role)",
        ),
        ('{"domain": "math"}', "exactly one of `prompt` and `prompt_tokens`"),
        ('{"domain": "math", "prompt_tokens": [1, "two"]}', "(at $.prompt_tokens[1])"),
        ('{"domain": "math", "prompt_tokens": [1, 99999999999]}', "(at $.prompt_tokens[1])"),
        ('{"domain": "math", "prompt_tokens": [1.5]}', "(at $.prompt_tokens[0])"),
        ('{"domain": "math", "prompt_tokens": [[1, 2]]}', "(at $.prompt_tokens[0])"),
    ],
)
def test_bad_lines_name_the_line_and_the_field(line: str, expected: str) -> None:
    with pytest.raises(CliError) as caught:
        parse_task(line, 4)
    assert caught.value.exit_code == 2
    message = str(caught.value)
    assert message.startswith("line 4: ")
    assert expected in message


def test_read_tasks_skips_blank_and_comment_lines_but_counts_them() -> None:
    text = (
        '# tasks\n\n{"id": "a", "domain": "d", "prompt": "x"}\n   \n'
        '{"domain": "d", "n": -1, "prompt": "y"}\n'
    )
    tasks = read_tasks(io.StringIO(text))
    assert next(tasks).id == "a"
    with pytest.raises(CliError, match=r"^line 5: .*\$\.n"):
        next(tasks)


# ---------------------------------------------------------------- parser


def test_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["--help"])
    assert caught.value.code == 0
    printed = capsys.readouterr().out
    listed = re.findall(r"^\s{4}(\w+)\s", printed, re.MULTILINE)
    assert tuple(listed) == COMMANDS
    assert "usage: temper" in printed


def test_no_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main([])
    assert caught.value.code == 2
    assert "COMMAND" in capsys.readouterr().err


def test_nats_url_defaults_to_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TEMPER_NATS_URL", raising=False)
    assert build_parser().parse_args(["status"]).nats_url == "nats://127.0.0.1:4222"
    monkeypatch.setenv("TEMPER_NATS_URL", "nats://elsewhere:4000")
    assert build_parser().parse_args(["status"]).nats_url == "nats://elsewhere:4000"
    args = build_parser().parse_args(["--nats-url", "nats://flag:1", "status"])
    assert args.nats_url == "nats://flag:1"


def test_command_arguments() -> None:
    parser = build_parser()
    up = parser.parse_args(["up", "--service", "a", "--service", "b", "--nats-port", "5000"])
    assert (up.services, up.nats_port, up.run_dir, up.external_nats) == (
        ["a", "b"],
        5000,
        Path("run"),
        False,
    )
    retry = parser.parse_args(["dlq", "retry", "3", "4"])
    assert (retry.seq, retry.all) == ([3, 4], False)
    assert parser.parse_args(["dlq", "retry", "--all", "--source", "S"]).source == "S"
    record = parser.parse_args(["record", "temper.v1.>", "out.jsonl", "--count", "5"])
    assert (record.subject, record.file, record.count) == ("temper.v1.>", Path("out.jsonl"), 5)
    replay = parser.parse_args(["replay", "in.jsonl", "--keep-ids", "--subject", "x.y"])
    assert (replay.keep_ids, replay.subject, replay.rate) == (True, "x.y", 0.0)


@pytest.mark.parametrize("argv", [["dlq"], ["dlq", "show", "seven"], ["tail"], ["check"]])
def test_usage_errors_exit_2(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(argv)
    assert caught.value.code == 2


# ---------------------------------------------------------------- errors before any connection


def run_main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(argv)
    return code, capsys.readouterr().err


def test_up_with_an_unknown_service(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run_main(["up", "--service", "nosuch"], capsys)
    assert code == 2
    assert err.startswith("temper: unknown service 'nosuch'; known: ")
    assert "control" in err
    assert "Traceback" not in err


def test_serve_an_unknown_service(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run_main(["serve", "nosuch"], capsys)
    known = ", ".join(sorted(registry.entries()))
    assert (code, err.strip()) == (2, f"temper: unknown service 'nosuch'; known: {known}")


def test_serve_with_a_bad_setting(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEMPER_CONTROL_STALE_AFTER_S", "soon")
    code, err = run_main(["serve", "control"], capsys)
    assert code == 2
    assert "TEMPER_CONTROL_STALE_AFTER_S='soon'" in err


def test_up_stops_before_starting_when_the_sandbox_would_refuse_a_domain(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "slow.toml"
    config.write_text(
        '[[domain]]\nname = "slow-python"\nkind = "python_functions"\n'
        "params = { timeout_s = 100.0 }\n"
    )
    monkeypatch.setenv("TEMPER_VALIDATOR_DOMAINS_CONFIG", str(config))
    monkeypatch.setenv("TEMPER_SANDBOX_MAXIMA_TIMEOUT_S", "90")
    argv = ["up", "--run-dir", str(tmp_path), "--service", "sandbox", "--service", "validator"]
    code, err = run_main(argv, capsys)
    assert code == 2
    assert "domain 'slow-python': timeout_s 100 is above the maximum 90" in err
    assert "TEMPER_SANDBOX_MAXIMA_TIMEOUT_S" in err
    assert not (tmp_path / "logs").exists()  # nothing was started


def test_up_stops_when_a_sandbox_default_is_above_its_maximum(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEMPER_SANDBOX_MAXIMA_MEMORY_MB", "1024")
    code, err = run_main(["up", "--run-dir", str(tmp_path), "--service", "sandbox"], capsys)
    assert code == 2
    assert "language 'cpp': memory_mb 2048 is above the maximum 1024" in err


def test_submit_a_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run_main(["submit", str(tmp_path / "none.jsonl")], capsys)
    assert code == 2
    assert "none.jsonl: no such file" in err


def test_submit_a_bad_file_fails_before_connecting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_text('{"domain": "math", "prompt": "ok"}\n{"domain": "m", "prompt": "x", "n": 0}\n')
    # Nothing listens on port 9: a connection attempt would fail with exit code 1, not 2.
    code, err = run_main(["--nats-url", "nats://127.0.0.1:9", "submit", str(path)], capsys)
    assert code == 2
    assert "line 2: invalid task" in err
    assert "$.n" in err


def test_dlq_retry_needs_sequences_or_all(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run_main(["dlq", "retry"], capsys)
    assert code == 2
    assert "--all" in err


def test_replay_a_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run_main(["replay", str(tmp_path / "none.jsonl")], capsys)
    assert code == 2
    assert "no such file" in err


@pytest.mark.parametrize(
    "line",
    [
        "not json",
        '{"subject": "a.b", "headers": {}}',
        '{"subject": "a.b", "headers": {}, "data": "!!not base64!!"}',
        '{"headers": {}, "data": "AAE="}',
        '{"subject": "a.b", "headers": ["x"], "data": "AAE="}',
        '{"subject": "a.b", "headers": {"k": 1}, "data": "AAE="}',
    ],
)
def test_replay_a_bad_record_names_the_line(
    line: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "rec.jsonl"
    good = '{"subject": "a.b", "headers": {}, "data": "AAE="}'
    path.write_text(f"{good}\n{line}\n")
    code, err = run_main(["--nats-url", "nats://127.0.0.1:9", "replay", str(path)], capsys)
    assert code == 2
    assert f"{path}:2: not a recorded message" in err


def test_up_with_sglang_engine_needs_a_server_url(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["up", "--engine", "sglang"]) == 2
    assert "--sglang-url" in capsys.readouterr().err


def test_up_refuses_a_model_dir_without_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["up", "--model", str(tmp_path)]) == 2
    assert "not a model directory" in capsys.readouterr().err


def test_generator_env_comes_from_the_command_line(tmp_path: Path) -> None:
    from services.cli.stack import policy_env
    from services.model.tiny import init_model

    model = init_model(tmp_path / "m")
    args = build_parser().parse_args(
        ["up", "--model", str(model), "--engine", "sglang", "--sglang-url", "http://127.0.0.1:1"]
    )
    env = policy_env(args, ("generator", "learner"))
    assert env == {
        "TEMPER_GENERATOR_MODEL": str(model.resolve()),
        "TEMPER_GENERATOR_ENGINE": "sglang",
        "TEMPER_GENERATOR_SGLANG_URLS": "http://127.0.0.1:1",
        "TEMPER_LEARNER_MODEL": str(model.resolve()),
        "TEMPER_LEARNER_OUT_DIR": str(Path("run/learner").resolve()),
        "TEMPER_GATEWAY_MODEL": str(model.resolve()),
        "TEMPER_GATEWAY_STATE_DIR": str(Path("run/gateway").resolve()),
        # Half the cores each: the two torch processes share the machine.
        "TEMPER_GENERATOR_THREADS": str(max(1, (os.cpu_count() or 2) // 2)),
        "TEMPER_LEARNER_THREADS": str(max(1, (os.cpu_count() or 2) // 2)),
    }
    assert policy_env(args, ("control",)) == {}
    assert policy_env(args, ("gateway",))["TEMPER_GATEWAY_MODEL"] == str(model.resolve())


def test_the_validators_domains_are_the_learners_and_the_gateways(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from services.cli.stack import policy_env
    from services.model.tiny import init_model

    args = build_parser().parse_args(["up", "--model", str(init_model(tmp_path / "m"))])
    monkeypatch.setenv("TEMPER_VALIDATOR_DOMAINS_CONFIG", "deploy/domains")
    monkeypatch.setenv("TEMPER_LEARNER_DOMAINS_CONFIG", "/elsewhere")
    monkeypatch.setenv("TEMPER_GENERATOR_THREADS", "3")
    env = policy_env(args, ("validator", "learner", "gateway"))
    assert "TEMPER_GENERATOR_THREADS" not in env and "TEMPER_LEARNER_THREADS" in env
    assert env["TEMPER_GATEWAY_DOMAINS_CONFIG"] == str(Path("deploy/domains").resolve())
    assert "TEMPER_LEARNER_DOMAINS_CONFIG" not in env  # set by the user: left as it is


def test_status_exit_code_forgives_a_gone_predecessor_not_a_gone_service() -> None:
    from protocol.messages import ServiceState, ServiceStatus, StackStatus
    from services.cli.stack import _healthy

    def one(service: str, instance: str, *, gone: bool = False) -> ServiceStatus:
        return ServiceStatus(
            service=service,
            instance=instance,
            state=ServiceState.RUNNING,
            healthy=not gone,
            age_s=0.0,
            gone=gone,
        )

    restarted = [one("learner", "old", gone=True), one("learner", "new"), one("replay", "r")]
    assert _healthy(StackStatus(services=restarted))
    assert not _healthy(
        StackStatus(services=[one("learner", "old", gone=True), one("replay", "r")])
    )
    assert not _healthy(StackStatus(services=[]))
