"""The warm-up trains on a tool reference as the agent loop holds it: the call, the tool's
output where the loop appends it (out of the loss), then the answer in the next turn."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from services.domains import Example, load_registry
from services.domains.formats import answer_text
from services.model.load import load_causal_lm
from services.model.sft import WarmupConfig, _batch, _Probe, completion_loss, reference_ids
from services.model.tokens import ChatTokenizer


@pytest.fixture(scope="module")
def tokenizer(tiny_model: Path) -> ChatTokenizer:
    return ChatTokenizer.load(tiny_model)


def modpow_example() -> Example:
    domain = load_registry(None).get("tool_use")
    for example in domain.examples(200, seed=2):
        if example.task.metadata["key"].startswith("tool:modpow:"):
            return example
    raise AssertionError("no modpow problem among 200 draws")


def test_a_tool_reference_is_call_then_masked_output_then_answer(tokenizer: ChatTokenizer) -> None:
    example = modpow_example()
    answer = str(example.task.metadata["answer"])
    assert example.tool_outputs == (answer + "\n",)
    call_text = example.reference.split("\n")[0]
    call = tokenizer.encode(call_text)
    seen = tokenizer.encode(tokenizer.observation(answer + "\n"))
    final = tokenizer.encode(answer_text(answer, "tag")) + list(tokenizer.eos_ids)
    ids, mask = reference_ids(tokenizer, example)
    # What AgentLoop appends (tests/unit/test_generator_agent.py): the call the model ends
    # with </tool_call>, the observation encoded on its own, the next turn's answer.
    assert ids == call + seen + final
    assert mask == [True] * len(call) + [False] * len(seen) + [True] * len(final)
    assert call[-1] == tokenizer.tool_call_end_id
    # The batch trains the call and the answer, never the tool's output.
    prompt = tokenizer.render(example.task.prompt)
    _, labels = _batch([(prompt, ids, mask)])
    trained = [int(t) for t in labels[0] if int(t) != -100]
    assert trained == call + final


def test_a_reference_without_tools_is_one_turn_and_a_miscount_is_an_error(
    tokenizer: ChatTokenizer,
) -> None:
    plain = load_registry(None).get("arithmetic").examples(1)[0]
    ids, mask = reference_ids(tokenizer, plain)
    assert ids == tokenizer.encode(plain.reference) + list(tokenizer.eos_ids) and all(mask)
    example = modpow_example()
    two = Example(task=example.task, reference=example.reference, tool_outputs=("1\n", "2\n"))
    with pytest.raises(ValueError, match="2 tool outputs for 1 calls"):
        reference_ids(tokenizer, two)


def test_tool_tasks_are_not_probed_with_one_greedy_turn(tokenizer: ChatTokenizer) -> None:
    config = WarmupConfig(target_accuracy=0.5, probe=16)
    tools = load_registry(None).get("tool_use")
    assert _Probe.of([(tools, 1.0)], tokenizer, config) is None
    arithmetic = load_registry(None).get("arithmetic")
    probe = _Probe.of([(tools, 1.0), (arithmetic, 1.0)], tokenizer, config)
    assert probe is not None and len(probe.prompts) == 8


def test_the_warm_up_loss_and_its_gradients_are_hf_s(tiny_model: Path) -> None:
    """Logits only where a label is trained: the same loss and gradients as HF's own
    (which computes them everywhere), on a batch of tool references with masked outputs."""
    tokenizer = ChatTokenizer.load(tiny_model)
    examples = load_registry(None).get("tool_use").examples(6, seed=1)
    pairs = [(tokenizer.render(e.task.prompt), *reference_ids(tokenizer, e)) for e in examples]
    ids, labels = _batch(pairs)
    model = load_causal_lm(tiny_model)
    ours = completion_loss(model, ids, labels)
    ours.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    theirs = model(input_ids=ids, labels=labels).loss
    theirs.backward()
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    for ours_grad, param in zip(grads, model.parameters(), strict=True):
        torch.testing.assert_close(ours_grad, param.grad, rtol=1e-4, atol=1e-6)


def test_a_recovery_reference_trains_both_calls_and_masks_the_error(
    tokenizer: ChatTokenizer,
) -> None:
    from services.domains.tool_use import domain

    plain = domain("m", {"task": "modpow"}).examples(40, seed=3)
    mixed = domain("m", {"task": "modpow", "recovery": 0.5}).examples(40, seed=3)
    # The same problems and splits: only some references change.
    assert [e.task.metadata["key"] for e in plain] == [e.task.metadata["key"] for e in mixed]
    recovered = [e for e in mixed if len(e.tool_outputs) == 2]
    assert 10 <= len(recovered) <= 30
    example = recovered[0]
    broken, fixed, final = example.reference.split("\n")
    assert final == answer_text(str(example.task.metadata["answer"]), "tag")
    assert broken.replace("prnt(", "print(") == fixed
    assert "NameError: name 'prnt' is not defined" in example.tool_outputs[0]
    ids, mask = reference_ids(tokenizer, example)
    error = tokenizer.encode(tokenizer.observation(example.tool_outputs[0]))
    first = tokenizer.encode(broken)
    assert ids[: len(first) + len(error)] == first + error
    assert mask[: len(first) + len(error)] == [True] * len(first) + [False] * len(error)


def test_a_failed_first_problem_starts_after_the_failed_call_and_its_error(
    tokenizer: ChatTokenizer,
) -> None:
    """The recovery probe: the same problems, the failed call and the sandbox's error (a
    fixed text: nothing of the answer) already in the context as the agent loop holds them."""
    from services.domains.tool_use import NAME_ERROR, domain

    plain = domain("m", {"task": "modpow"}).examples(20, split="eval", seed=3)
    probe = domain("m", {"task": "modpow", "failed_first": True}).examples(20, split="eval", seed=3)
    assert [e.task.metadata["key"] for e in plain] == [e.task.metadata["key"] for e in probe]
    for before, after in zip(plain, probe, strict=True):
        call, error = after.task.prompt[-2:]
        assert after.task.prompt[:-2] == before.task.prompt
        assert (call.role, error.role, error.content) == ("assistant", "tool", f"\n{NAME_ERROR}")
        assert call.content == before.reference.split("\n")[0].replace("print(", "prnt(", 1)
        assert (after.reference, after.tool_outputs) == (before.reference, before.tool_outputs)
    # Rendered as the loop holds a failed call: the call's ids, then the observation's.
    example = probe[0]
    held = (
        tokenizer.render(example.task.prompt[:-2])
        + tokenizer.encode(example.task.prompt[-2].content)
        + tokenizer.encode(tokenizer.observation(example.task.prompt[-1].content))
    )
    assert tokenizer.render(example.task.prompt) == held
