"""What the validator tells clients about the domains it serves (``temper.v1.domains``).

The validator owns the answer because it loads the domain registry and turns each
domain's ValidatorSpecs into judges: it knows which ``Task.metadata`` keys those judges
read, so a client can build tasks that are scored instead of marked ``invalid``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import msgspec

from protocol.codec import check_size, encode
from protocol.errors import ErrorCode, PayloadTooLarge
from protocol.messages import DomainInfo, DomainList, DomainsRequest, DomainValidator, Task
from services.domains import Domain, DomainError, DomainRegistry
from services.domains.reasoning_gym import METADATA as REASONING_GYM_ENTRY
from services.domains.sandbox_place import SANDBOX_IMAGE, SANDBOX_LIMITS
from services.evaluation.heldout import HeldoutSet
from services.runtime.errors import RequestRejected

#: Held-out problems an evaluation takes at most (``HeldoutSet.of``'s default).
EVAL_LIMIT: Final = 500
#: Seconds one request may spend counting held-out problems (about 0.5-2 s a domain).
COUNT_BUDGET_S: Final = 5.0

Keys = Callable[[Mapping[str, Any]], tuple[str, ...]]


def _answer_key(params: Mapping[str, Any]) -> tuple[str, ...]:
    return (str(params.get("answer_key", "answer")),)


def _document_and_answer(params: Mapping[str, Any]) -> tuple[str, ...]:
    return ("document", "answer")


def _document(params: Mapping[str, Any]) -> tuple[str, ...]:
    return ("document",)


def _tests(params: Mapping[str, Any]) -> tuple[str, ...]:
    return ("calls", "expected")


def _part(params: Mapping[str, Any]) -> tuple[str, ...]:
    return ("part",)


def _files_and_checks(params: Mapping[str, Any]) -> tuple[str, ...]:
    return ("sandbox_files", "checks")


def _harbor_task(params: Mapping[str, Any]) -> tuple[str, ...]:
    # The key names the task of the validator's own folder; image and limits its session.
    return ("key", SANDBOX_IMAGE, SANDBOX_LIMITS)


def _reasoning_gym_entry(params: Mapping[str, Any]) -> tuple[str, ...]:
    return (REASONING_GYM_ENTRY,)


#: The ``Task.metadata`` keys each built-in validator kind reads (the others read none).
METADATA_KEYS: Final[Mapping[str, Keys]] = {
    "exact": _answer_key,
    "math": _answer_key,
    "doc_qa": _document_and_answer,
    "doc_file": _document,
    "code": _tests,
    "cad": _part,
    "terminal": _files_and_checks,
    "harbor": _harbor_task,
    "reasoning_gym": _reasoning_gym_entry,
}


def metadata_keys(domain: Domain) -> list[str]:
    """Keys a task of ``domain`` must carry in ``metadata``, in validator order, once each."""
    keys: dict[str, None] = {}
    for spec in domain.validators:
        read = METADATA_KEYS.get(spec.kind)
        keys.update(dict.fromkeys(read(spec.params) if read else ()))
    return list(keys)


def plain_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """Validator parameters as msgpack-safe values (TOML dates become ISO text)."""
    try:
        converted: dict[str, Any] = msgspec.to_builtins(dict(params), str_keys=True)
    except TypeError:
        return {str(key): str(value) for key, value in params.items()}
    return converted


def eval_size(domain: Domain, limit: int = EVAL_LIMIT) -> int | None:
    """Distinct held-out problems an evaluation of ``domain`` uses; ``None`` if it has none."""
    try:
        return len(HeldoutSet.of(domain, limit).problems)
    except DomainError:
        return 0 if domain.eval_fraction == 0 else None


def example_task(domain: Domain) -> Task | None:
    try:
        return domain.make_tasks(1, split="train", seed=0)[0]
    except DomainError:
        return None


def domain_info(domain: Domain, size: int | None, example: Task | None) -> DomainInfo:
    return DomainInfo(
        name=domain.name,
        kind=domain.kind,
        description=domain.description,
        prompt_system=domain.prompt.system,
        prompt_template=domain.prompt.template,
        metadata_keys=metadata_keys(domain),
        validators=[
            DomainValidator(
                kind=spec.kind,
                name=spec.label,
                weight=spec.weight,
                params=plain_params(spec.params),
            )
            for spec in domain.validators
        ],
        tools=list(domain.tools),
        tier=domain.tier,
        samples=domain.samples,
        max_tokens=domain.max_tokens,
        max_turns=domain.max_turns,
        pass_threshold=domain.pass_threshold,
        overlong=domain.overlong,
        sandbox=domain.sandbox,
        eval_fraction=domain.eval_fraction,
        eval_size=size,
        example=example,
    )


class Catalog:
    """Answers DomainsRequest; held-out sizes are counted once per domain, off the event loop.

    Counting draws thousands of problems per domain, so it is done when a request needs
    it (not at start, which it would slow for every stack), within ``budget_s`` per
    request, and remembered: with hundreds of domains the first answers leave some
    ``eval_size`` unset, and later ones fill them in.
    """

    def __init__(
        self, registry: DomainRegistry, validator: str, budget_s: float = COUNT_BUDGET_S
    ) -> None:
        self.registry = registry
        self.validator = validator
        self.budget_s = budget_s
        self._sizes: dict[str, int | None] = {}
        self._counting = asyncio.Lock()

    def pick(self, names: Sequence[str]) -> list[Domain]:
        if not names:
            return list(self.registry)
        for index, name in enumerate(names):
            if name not in self.registry:
                raise RequestRejected(
                    ErrorCode.BAD_REQUEST,
                    f"domain {name!r} is not served here ({len(self.registry)} domains are)",
                    field=f"$.names[{index}]",
                )
        return [self.registry.get(name) for name in names]

    async def sizes(self, domains: list[Domain]) -> dict[str, int | None]:
        """Held-out sizes of ``domains``; ``None`` for those not counted within the budget."""
        async with self._counting:
            missing = [d for d in domains if d.name not in self._sizes]
            if missing:
                self._sizes.update(await asyncio.to_thread(self._count, missing))
        return {d.name: self._sizes.get(d.name) for d in domains}

    def _count(self, domains: list[Domain]) -> dict[str, int | None]:
        deadline = time.monotonic() + self.budget_s
        counted: dict[str, int | None] = {}
        for domain in domains:
            if counted and time.monotonic() > deadline:
                break  # the rest on a later request; at least one per request, so it ends
            counted[domain.name] = eval_size(domain)
        return counted

    async def answer(self, request: DomainsRequest, max_payload: int) -> DomainList:
        domains = self.pick(request.names)
        sizes = await self.sizes(domains)
        reply = DomainList(
            domains=[
                domain_info(d, sizes[d.name], example_task(d) if request.examples else None)
                for d in domains
            ],
            validator=self.validator,
        )
        try:
            check_size(encode(reply), None, max_payload)
        except PayloadTooLarge as error:
            raise RequestRejected(
                ErrorCode.TOO_LARGE,
                f"{len(domains)} domains do not fit one reply ({error.message}); "
                "ask for fewer by `names`, or without `examples`",
            ) from None
        return reply
