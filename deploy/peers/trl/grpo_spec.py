"""The TRL runner's SPEC.json and its reward rules, in plain Python (no TRL, no torch).

grpo_run.py, inside the TRL venv, reads its spec and scores completions with this module;
Temper's unit tests import it from Temper's venv, which has no TRL.  README.md here lists
the fields.  A spec is checked whole before anything loads: a bad one raises SpecError
naming the field (``minibatches``, ``train[3].domain``, ``rewards['x']``).

Rewards: each train row may name its ``domain``; the spec's ``rewards`` maps each domain
to a rule by name, and each completion is scored by its row's domain's rule.  Rows without
a domain (and no ``rewards``) are scored by ``answer_exact``.

Tools: a spec that names ``tools`` (``python``) trains with TRL's tool loop.  The model's
calls and the tool outputs are written as Temper's agent loop writes them
(``<tool_call>{"name": ..., "arguments": ...}</tool_call>``, then a ``tool`` turn):
:data:`TOOL_CHAT_TEMPLATE` renders a conversation with tool calls in that format, so the
token ids TRL builds between turns are the ones Temper's loop appends.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import types
import typing
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any


class SpecError(ValueError):
    """A spec that cannot be run: ``key`` is the field, ``problem`` what is wrong with it."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"spec: {key}: {problem}")
        self.key = key
        self.problem = problem


# --- reward rules ---------------------------------------------------------------------------

ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def first_answer(text: str) -> str | None:
    """The stripped text of the first complete ``<answer>...</answer>`` tag, if any."""
    match = ANSWER_TAG.search(text)
    return None if match is None else match.group(1).strip()


def last_answer(text: str) -> str | None:
    """The stripped text of the last complete ``<answer>...</answer>`` tag (Temper's rule)."""
    found = ANSWER_TAG.findall(text)
    return found[-1].strip() if found else None


def number(text: str) -> float | None:
    """The finite number ``text`` spells as a whole (``12``, ``-3``, ``12.0``), else None."""
    try:
        value = float(text.strip())
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def answer_exact(text: str, answer: str) -> float:
    """1.0 when the first answer tag's text (stripped) is the answer, character for character."""
    return 1.0 if first_answer(text) == answer else 0.0


def answer_number(text: str, answer: str) -> float:
    """1.0 when the first answer tag holds a number equal to the answer (``12.0`` is ``12``)."""
    given = first_answer(text)
    got = None if given is None else number(given)
    return 1.0 if got is not None and got == number(answer) else 0.0


_SPACES = re.compile(r"\s+")
#: What Temper's ``exact`` validator strips from an answer's edges, spaces collapsed first.
EDGE_PUNCTUATION = "\"'`.,;:!? "


def normalized(text: str) -> str:
    """NFKC, whitespace collapsed, edge punctuation dropped, case folded: how Temper's
    ``exact`` validator compares an answer."""
    return _SPACES.sub(" ", unicodedata.normalize("NFKC", text)).strip(EDGE_PUNCTUATION).casefold()


def tool_call_text(name: object, arguments: object) -> str:
    """One tool call as the model writes it (Temper's ``services/model/tool_format.py``)."""
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
#: The tools a spec may name: the sandboxed ``python`` of Temper's tool domains.
TOOLS = ("python",)


def tool_format(text: str) -> float:
    """Temper's ``tool_call`` validator (``min_calls = 1``): the share of well-formed calls
    (JSON with a string ``name`` of a known tool and object ``arguments``), 0 without one."""
    calls = [_well_formed(block) for block in TOOL_CALL.findall(text)]
    good = sum(calls)
    return good / len(calls) if good else 0.0


def _well_formed(block: str) -> bool:
    try:
        body = json.loads(block.strip())
    except ValueError:
        return False
    return (
        isinstance(body, dict)
        and body.get("name") in TOOLS
        and isinstance(body.get("arguments", {}), dict)
    )


def tool_answer(text: str, answer: str) -> float:
    """Temper's tool domains' reward: 0.8 for the last answer tag equal to the answer
    (compared as Temper's ``exact`` validator compares), 0.2 for well-formed tool calls."""
    given = last_answer(text)
    right = given is not None and normalized(given) == normalized(answer)
    return 0.8 * right + 0.2 * tool_format(text)


def last_answer_number(text: str, answer: str) -> float:
    """1.0 when the last answer tag holds a number equal to the answer: Temper's math
    validator's reading (the last tag, compared as numbers)."""
    given = last_answer(text)
    got = None if given is None else number(given)
    return 1.0 if got is not None and got == number(answer) else 0.0


@dataclasses.dataclass(frozen=True)
class Rule:
    score: Callable[[str, str], float]
    #: What a row's answer must be for the rule to be able to score it (checked at load).
    answer_ok: Callable[[str], bool]
    answer_needs: str


RULES: dict[str, Rule] = {
    "answer_exact": Rule(answer_exact, lambda answer: bool(answer.strip()), "a non-empty string"),
    "answer_number": Rule(answer_number, lambda answer: number(answer) is not None, "a number"),
    "last_answer_number": Rule(
        last_answer_number, lambda answer: number(answer) is not None, "a number"
    ),
    "tool_answer": Rule(tool_answer, lambda answer: bool(answer.strip()), "a non-empty string"),
}
#: The rule of rows that name no domain (the runner's only rule before domains).
DEFAULT_RULE = "answer_exact"
#: The ``domain`` of a row that names none.
NO_DOMAIN = ""

Scorer = Callable[[str, str], float]


#: How ``python -c`` names the code's frames in a traceback, and how Temper's sandbox does
#: (its agent compiles the code as ``<sandbox>``).
_STRING_FRAME = 'File "<string>", line '
_SANDBOX_FRAME = 'File "<sandbox>", line '


def tool_output(stdout: str, stderr: str) -> str:
    """What Temper's sandboxed ``python`` returns for a run that printed these: stdout, then
    stderr after a newline, the code's frames named as the sandbox names them, so that
    an error reads the same on both sides (a warm-up's recovery references show it)."""
    return stdout + (f"\n{stderr.replace(_STRING_FRAME, _SANDBOX_FRAME)}" if stderr else "")


def completion_text(completion: str | list[dict[str, Any]]) -> str:
    """TRL hands conversational completions as a list of messages.  The text is what
    Temper's completion text holds: the assistant's turns, each tool call written as the
    model wrote it, and the tool outputs between them."""
    if isinstance(completion, str):
        return completion
    parts: list[str] = []
    for message in completion:
        if message.get("role") == "tool":
            parts.append(str(message.get("content", "")))
        if message.get("role") != "assistant":
            continue
        parts.append(str(message.get("content") or ""))
        for call in message.get("tool_calls") or []:
            function = call.get("function", call)
            parts.append(tool_call_text(function.get("name"), function.get("arguments")))
    return "".join(parts)


#: ChatML as the warmed-up policies' own template writes it, plus what a tool loop needs:
#: an assistant turn's calls as ``<tool_call>{json}</tool_call>`` after its text, and a
#: ``tool`` turn for each output.  ``tojson`` writes what Python's ``json.dumps`` does.
TOOL_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}{% endif %}"
    "{% for call in message.get('tool_calls') or [] %}"
    "{% set function = call['function'] if 'function' in call else call %}"
    "{{ '<tool_call>' + {'name': function['name'], 'arguments': function['arguments']} | tojson"
    " + '</tool_call>' }}"
    "{% endfor %}"
    "{{ '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def route(
    rules: Mapping[str, Scorer],
    texts: Sequence[str],
    answers: Sequence[str],
    domains: Sequence[str],
) -> list[float]:
    """Each completion scored by its domain's rule."""
    return [rules[d](t, a) for t, a, d in zip(texts, answers, domains, strict=True)]


# --- the spec -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Spec:
    model_dir: str
    train: list[dict[str, Any]]
    group: int
    samples_per_step: int
    lr: float
    max_new_tokens: int
    temperature: float = 1.0
    seed: int = 0
    minutes: float = 1.0
    snapshot_every_s: float = 30.0
    threads: int = 2
    # Completions per forward/backward pass; an optimizer step still sees all its samples
    # (gradient accumulation).  Defaults to one pass per optimizer step.
    micro_batch: int | None = None
    # Optimizer steps per generation batch of samples_per_step completions (Temper's
    # learner ``minibatches``): the batch is shuffled and split into this many steps.
    minibatches: int = 1
    # Linear decay from lr to lr * lr_final over this many generation batches, then held
    # (0: constant): Temper's learner schedule, so both sides train with the same rates.
    lr_decay_steps: int = 0
    lr_final: float = 0.1
    # Completions cut at max_new_tokens are left out of the loss (TRL's option of the name).
    mask_truncated_completions: bool = False
    # Domain -> rule name (RULES), for rows that name their domain.
    rewards: dict[str, str] | None = None
    # Tools the model may call (TOOLS), each run in a subprocess with this timeout; at most
    # this many tool rounds a completion (Temper's domain ``max_turns`` less the last).
    tools: list[str] | None = None
    tool_timeout_s: float = 10.0
    max_tool_calls: int = 3

    @property
    def samples_per_update(self) -> int:
        """Completions per optimizer step."""
        return self.samples_per_step // self.minibatches

    @property
    def micro(self) -> int:
        return self.micro_batch or self.samples_per_update

    @property
    def accumulation(self) -> int:
        """Forward/backward passes per optimizer step."""
        return self.samples_per_update // self.micro

    def lr_factor(self, update: int) -> float:
        """The rate's factor at optimizer step ``update``: it falls once per generation batch,
        so every step of a batch has the same rate, as in Temper's learner."""
        if not self.lr_decay_steps:
            return 1.0
        done = min(update // self.minibatches, self.lr_decay_steps) / self.lr_decay_steps
        return 1.0 - (1.0 - self.lr_final) * done

    def scorers(self) -> dict[str, Scorer]:
        """Domain -> the function that scores its completions."""
        if self.rewards is None:
            return {NO_DOMAIN: RULES[DEFAULT_RULE].score}
        return {domain: RULES[name].score for domain, name in self.rewards.items()}


def load_spec(path: Path) -> Spec:
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise SpecError(str(path), f"cannot be read as JSON: {error}") from None
    return parse_spec(raw)


def parse_spec(raw: Any) -> Spec:
    """A checked Spec from decoded JSON; SpecError names the first field that is wrong."""
    if not isinstance(raw, dict):
        raise SpecError("(top level)", f"must be a JSON object, not {type(raw).__name__}")
    fields = {f.name: f for f in dataclasses.fields(Spec)}
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise SpecError(unknown[0], f"unknown field (known: {', '.join(fields)})")
    hints = typing.get_type_hints(Spec)
    for name, field in fields.items():
        if name not in raw:
            if field.default is dataclasses.MISSING:
                raise SpecError(name, "required")
            continue
        if not _conforms(raw[name], hints[name]):
            raise SpecError(name, f"must be {field.type}, not {raw[name]!r}")
    spec = Spec(**raw)
    _check_numbers(spec)
    _check_batches(spec)
    _check_rows(spec)
    _check_tools(spec)
    return spec


def _conforms(value: Any, hint: Any) -> bool:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_conforms(value, arm) for arm in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if origin is list:
        return isinstance(value, list)  # rows are checked one by one, with their index
    if origin is dict:
        value_hint = typing.get_args(hint)[1]
        return isinstance(value, dict) and all(
            isinstance(k, str) and _conforms(v, value_hint) for k, v in value.items()
        )
    if hint is float:  # JSON writes 1.0 as 1
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, hint)


#: field -> (smallest allowed, whether the bound itself is allowed)
_LOWER: dict[str, tuple[float, bool]] = {
    "group": (2, True),  # GRPO's advantage needs at least two completions per prompt
    "samples_per_step": (1, True),
    "lr": (0, False),
    "max_new_tokens": (1, True),
    "temperature": (0, False),
    "minutes": (0, False),
    "snapshot_every_s": (0, False),
    "threads": (1, True),
    "micro_batch": (1, True),
    "minibatches": (1, True),
    "lr_decay_steps": (0, True),
    "lr_final": (0, True),
    "tool_timeout_s": (0, False),
    "max_tool_calls": (1, True),
}


def _check_numbers(spec: Spec) -> None:
    for name, (low, inclusive) in _LOWER.items():
        value = getattr(spec, name)
        if value is None:
            continue
        if not math.isfinite(value) or value < low or (value == low and not inclusive):
            bound = f">= {low}" if inclusive else f"> {low}"
            raise SpecError(name, f"must be {bound}, not {value!r}")
    if spec.lr_final > 1:
        raise SpecError("lr_final", f"must be <= 1, not {spec.lr_final!r}")


def _check_batches(spec: Spec) -> None:
    if spec.samples_per_step % spec.group:
        raise SpecError(
            "samples_per_step", f"{spec.samples_per_step} is not a multiple of group {spec.group}"
        )
    if spec.samples_per_step % spec.minibatches:
        raise SpecError(
            "minibatches",
            f"{spec.minibatches} does not divide samples_per_step {spec.samples_per_step}",
        )
    if spec.samples_per_update % spec.micro:
        raise SpecError(
            "micro_batch",
            f"{spec.micro} does not divide the {spec.samples_per_update} completions of an "
            f"optimizer step (samples_per_step / minibatches)",
        )


_ROW_KEYS = ("messages", "answer", "domain")


def _check_rows(spec: Spec) -> None:
    if not spec.train:
        raise SpecError("train", "is empty")
    for index, row in enumerate(spec.train):
        _check_row(index, row)
    named = [i for i, row in enumerate(spec.train) if "domain" in row]
    if named and len(named) != len(spec.train):
        missing = next(i for i, row in enumerate(spec.train) if "domain" not in row)
        raise SpecError(
            f"train[{missing}].domain",
            f"missing, while train[{named[0]}] names one: every row names its domain, or none",
        )
    if not named:
        if spec.rewards is not None:
            raise SpecError("rewards", "given, but no train row names a domain to route by")
        _check_answers(spec, {NO_DOMAIN: DEFAULT_RULE})
        return
    if spec.rewards is None:
        raise SpecError("rewards", "required: the train rows name domains")
    _check_rewards(spec, spec.rewards)


def _check_row(index: int, row: Any) -> None:
    key = f"train[{index}]"
    if not isinstance(row, dict):
        raise SpecError(key, f"must be an object, not {row!r}")
    unknown = sorted(set(row) - set(_ROW_KEYS))
    if unknown:
        raise SpecError(f"{key}.{unknown[0]}", f"unknown row field (known: {', '.join(_ROW_KEYS)})")
    messages = row.get("messages")
    if not isinstance(messages, list) or not messages:
        raise SpecError(f"{key}.messages", "must be a non-empty list of {role, content}")
    for turn, message in enumerate(messages):
        if not (
            isinstance(message, dict)
            and set(message) == {"role", "content"}
            and all(isinstance(v, str) for v in message.values())
        ):
            problem = f"must be {{role, content}} strings, not {message!r}"
            raise SpecError(f"{key}.messages[{turn}]", problem)
    for name in ("answer", "domain"):
        if name in row and not isinstance(row[name], str):
            raise SpecError(f"{key}.{name}", f"must be a string, not {row[name]!r}")
    if "answer" not in row:
        raise SpecError(f"{key}.answer", "required")


def _check_rewards(spec: Spec, rewards: dict[str, str]) -> None:
    for domain, name in rewards.items():
        if name not in RULES:
            raise SpecError(
                f"rewards[{domain!r}]", f"unknown rule {name!r} (known: {', '.join(RULES)})"
            )
    used = {row["domain"] for row in spec.train}
    for index, row in enumerate(spec.train):
        if row["domain"] not in rewards:
            raise SpecError(
                f"train[{index}].domain",
                f"{row['domain']!r} has no rule in rewards (it has: {', '.join(sorted(rewards))})",
            )
    for domain in rewards:
        if domain not in used:
            raise SpecError(f"rewards[{domain!r}]", "no train row has this domain")
    _check_answers(spec, rewards)


def _check_answers(spec: Spec, rewards: Mapping[str, str]) -> None:
    """Every answer is one its rule can score (``answer_number`` needs a number)."""
    for index, row in enumerate(spec.train):
        rule = RULES[rewards[row.get("domain", NO_DOMAIN)]]
        if not rule.answer_ok(row["answer"]):
            raise SpecError(
                f"train[{index}].answer",
                f"{row['answer']!r} is not {rule.answer_needs}, as its rule needs",
            )


def _check_tools(spec: Spec) -> None:
    for index, name in enumerate(spec.tools or []):
        if name not in TOOLS:
            raise SpecError(f"tools[{index}]", f"unknown tool {name!r} (known: {', '.join(TOOLS)})")
    if spec.tools is not None and not spec.tools:
        raise SpecError("tools", "is empty (leave it out for no tools)")
