"""The TRL peer runner's spec checks and reward routing (deploy/peers/trl/grpo_spec.py).

grpo_spec.py is plain Python so that it can be tested here: Temper's venv has no TRL, and
grpo_run.py, which wires it into TRL's GRPOTrainer, runs only in the peer's own venv.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from protocol.messages import ChatMessage
from services.model.tokens import ChatTokenizer
from services.model.tool_format import tool_call_text

PEER = Path(__file__).resolve().parents[2] / "deploy" / "peers" / "trl"


@pytest.fixture
def peer(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(PEER))
    return importlib.import_module("grpo_spec")


def row(answer: str = "12", domain: str | None = None) -> dict[str, Any]:
    found: dict[str, Any] = {"messages": [{"role": "user", "content": "5+7="}], "answer": answer}
    if domain is not None:
        found["domain"] = domain
    return found


def spec(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "model_dir": "/m",
        "train": [row()],
        "group": 8,
        "samples_per_step": 256,
        "lr": 3e-4,
        "max_new_tokens": 16,
    }
    return {**base, **fields}


def mixed(**fields: Any) -> dict[str, Any]:
    """Two domains, one scored by number and one by exact text."""
    rows = [row("12", "sum"), row("twelve", "words")]
    return spec(train=rows, rewards={"sum": "answer_number", "words": "answer_exact"}, **fields)


def test_rewards_are_routed_by_each_rows_domain(peer: ModuleType) -> None:
    scorers = peer.parse_spec(mixed()).scorers()
    texts = ["<answer>12.0</answer>", "<answer>12.0</answer>", "<answer> twelve </answer>"]
    scores = peer.route(scorers, texts, ["12", "12", "twelve"], ["sum", "words", "words"])
    # 12.0 is the number 12, but not the text "12"; the tag's text is stripped.
    assert scores == [1.0, 0.0, 1.0]


def test_only_the_first_answer_tag_counts(peer: ModuleType) -> None:
    assert peer.answer_number("<answer>3</answer> no, <answer>12</answer>", "12") == 0.0
    assert peer.answer_number("<answer>-4</answer>", "-4") == 1.0
    assert peer.answer_number("<answer>12 apples</answer>", "12") == 0.0
    assert peer.answer_number("<answer>nan</answer>", "12") == 0.0
    assert peer.answer_number("no tag: 12", "12") == 0.0


def test_the_last_tag_rule_reads_the_answer_as_temper_does(peer: ModuleType) -> None:
    assert peer.last_answer_number("<answer>3</answer> no, <answer>12</answer>", "12") == 1.0
    assert peer.last_answer_number("<answer>12</answer> no, <answer>3</answer>", "12") == 0.0
    assert peer.last_answer_number("<answer>12.0</answer><answer>oops", "12") == 1.0
    assert peer.last_answer_number("no tag: 12", "12") == 0.0


def test_rows_without_a_domain_keep_the_exact_rule(peer: ModuleType) -> None:
    scorers = peer.parse_spec(spec()).scorers()
    texts = ["<answer>12</answer>", "<answer>12.0</answer>"]
    assert peer.route(scorers, texts, ["12", "12"], [peer.NO_DOMAIN] * 2) == [1.0, 0.0]


def test_minibatches_split_a_batch_and_hold_the_rate_over_it(peer: ModuleType) -> None:
    parsed = peer.parse_spec(spec(minibatches=2, micro_batch=64, lr_decay_steps=10))
    assert (parsed.samples_per_update, parsed.accumulation) == (128, 2)
    # The rate falls once per batch of two optimizer steps, to a tenth after 10 batches.
    assert parsed.lr_factor(0) == parsed.lr_factor(1) == 1.0
    assert parsed.lr_factor(2) == pytest.approx(0.91)
    assert parsed.lr_factor(40) == pytest.approx(0.1)
    defaults = peer.parse_spec(spec())
    assert (defaults.minibatches, defaults.mask_truncated_completions) == (1, False)
    assert (defaults.samples_per_update, defaults.accumulation) == (256, 1)


@pytest.mark.parametrize(
    ("fields", "key", "words"),
    [
        ({"minibatch": 2}, "minibatch", "unknown field"),
        ({"minibatches": 3}, "minibatches", "does not divide samples_per_step 256"),
        ({"minibatches": 0}, "minibatches", ">= 1"),
        ({"minibatches": 2, "micro_batch": 96}, "micro_batch", "96 does not divide the 128"),
        ({"mask_truncated_completions": "yes"}, "mask_truncated_completions", "must be bool"),
        ({"group": True}, "group", "must be int"),
        ({"lr": 0}, "lr", "> 0"),
        ({"rewards": {"sum": "answer_number"}}, "rewards", "no train row names a domain"),
        ({"train": []}, "train", "is empty"),
        ({"train": [{"messages": [], "answer": "1"}]}, "train[0].messages", "non-empty"),
        ({"train": [{**row(), "solution": "1"}]}, "train[0].solution", "unknown row field"),
        ({"train": [row(), row(domain="sum")]}, "train[0].domain", "every row names"),
        ({"train": [row(domain="sum")]}, "rewards", "required"),
        ({"tools": ["bash"]}, "tools[0]", "unknown tool 'bash'"),
        ({"tools": []}, "tools", "is empty"),
        ({"tools": ["python"], "tool_timeout_s": 0}, "tool_timeout_s", "> 0"),
        ({"tools": ["python"], "max_tool_calls": 0}, "max_tool_calls", ">= 1"),
    ],
)
def test_a_bad_spec_names_its_key(
    peer: ModuleType, fields: dict[str, Any], key: str, words: str
) -> None:
    with pytest.raises(peer.SpecError) as caught:
        peer.parse_spec(spec(**fields))
    assert caught.value.key == key
    assert words in str(caught.value)


@pytest.mark.parametrize(
    ("rewards", "key", "words"),
    [
        ({"sum": "answer_number"}, "train[1].domain", "'words' has no rule in rewards"),
        (
            {"sum": "answer_number", "words": "answer_exact", "more": "answer_exact"},
            "rewards['more']",
            "no train row",
        ),
        ({"sum": "answer_regex", "words": "answer_exact"}, "rewards['sum']", "unknown rule"),
        ({"sum": "answer_exact", "words": "answer_number"}, "train[1].answer", "not a number"),
    ],
)
def test_a_bad_reward_map_names_its_key(
    peer: ModuleType, rewards: dict[str, str], key: str, words: str
) -> None:
    with pytest.raises(peer.SpecError) as caught:
        peer.parse_spec({**mixed(), "rewards": rewards})
    assert caught.value.key == key
    assert words in str(caught.value)


def test_a_missing_field_is_named(peer: ModuleType) -> None:
    raw = spec()
    del raw["group"]
    with pytest.raises(peer.SpecError, match=r"spec: group: required"):
        peer.parse_spec(raw)


def test_conversational_completions_are_read_as_the_assistants_text(peer: ModuleType) -> None:
    turns = [{"role": "assistant", "content": "<answer>"}, {"role": "assistant", "content": "7"}]
    assert peer.completion_text(turns) == "<answer>7"
    assert peer.completion_text("plain") == "plain"


# --- tools ----------------------------------------------------------------------------------

CALL = {"name": "python", "arguments": {"code": "print(pow(3, 5, 7))"}}


def tool_turns(output: str = "5\n") -> list[dict[str, Any]]:
    """A TRL completion with one tool round: the call, the output, the answer."""
    call = {"type": "function", "function": CALL}
    return [
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "name": "python", "content": output},
        {"role": "assistant", "content": "<answer>5</answer>"},
    ]


def test_a_tool_completion_reads_as_temper_writes_it(peer: ModuleType) -> None:
    text = peer.completion_text(tool_turns())
    call = '<tool_call>{"name": "python", "arguments": {"code": "print(pow(3, 5, 7))"}}</tool_call>'
    assert text == f"{call}5\n<answer>5</answer>"


def test_the_tool_rule_is_temper_s_exact_answer_and_call_format(peer: ModuleType) -> None:
    text = peer.completion_text(tool_turns())
    assert peer.tool_answer(text, "5") == pytest.approx(1.0)
    assert peer.tool_answer(text, "6") == pytest.approx(0.2)  # the call alone
    # Temper's exact validator: edge punctuation, case and spaces do not count.
    assert peer.tool_answer("<answer> 5. </answer>", "5") == pytest.approx(0.8)
    bad = '<tool_call>{"name": "bash", "arguments": {}}</tool_call><tool_call>{oops</tool_call>'
    assert peer.tool_format(bad) == 0.0  # no well-formed call of a known tool
    mixed = f"{bad}<tool_call>{json.dumps(CALL)}</tool_call>"
    assert peer.tool_format(mixed) == pytest.approx(1 / 3)
    assert peer.parse_spec(tool_spec()).scorers()["modpow"](text, "5") == pytest.approx(1.0)


def tool_spec(**fields: Any) -> dict[str, Any]:
    tools = {"train": [row("5", "modpow")], "rewards": {"modpow": "tool_answer"}}
    return spec(**{**tools, "tools": ["python"], **fields})


def test_the_tool_template_renders_the_ids_temper_s_agent_loop_holds(
    peer: ModuleType, tiny_model: Path
) -> None:
    """TRL builds a tool round's ids from this template; they must be the ids Temper's loop
    holds for the same round: the prompt as the model's own template renders it, the call,
    then the observation Temper appends (end of turn, tool turn, next assistant turn)."""
    from transformers import AutoTokenizer

    ours = ChatTokenizer.load(tiny_model)
    hf = AutoTokenizer.from_pretrained(str(tiny_model))
    prompt = [{"role": "system", "content": "Use python."}, {"role": "user", "content": "3^5%7?"}]
    conversation = [*prompt, *tool_turns()[:2]]
    rendered = hf.apply_chat_template(
        conversation,
        chat_template=peer.TOOL_CHAT_TEMPLATE,
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )
    held = ours.render([ChatMessage(role=m["role"], content=m["content"]) for m in prompt])
    held += ours.encode(tool_call_text("python", CALL["arguments"]))
    held += ours.encode(ours.observation("5\n"))
    assert list(rendered) == held
    # TRL keeps a template only if it is prefix-preserving (else it swaps in its own).
    before = hf.apply_chat_template(
        conversation[:3], chat_template=peer.TOOL_CHAT_TEMPLATE, tokenize=True, return_dict=False
    )
    assert list(rendered[: len(before)]) == list(before)
