"""What the validator says about its domains: metadata keys, validators, held-out sizes."""

from __future__ import annotations

import datetime

import pytest

from protocol import ANY, DomainsRequest, ErrorCode
from protocol.messages import DomainList
from services.domains import load_registry
from services.runtime.errors import RequestRejected
from services.validator.catalog import Catalog, metadata_keys, plain_params

REGISTRY = load_registry(None, plugins=False)


def test_metadata_keys_are_what_the_validators_read() -> None:
    keys = {domain.name: metadata_keys(domain) for domain in REGISTRY}
    assert keys == {
        "arithmetic": ["answer"],
        "arithmetic_sum3": ["answer"],
        "arithmetic_sum4": ["answer"],
        "math_word_problems": ["answer"],
        "python_functions": ["calls", "expected"],
        "doc_numeric_qa": ["document", "answer"],
        "tool_use": ["answer"],
    }


def test_every_domain_task_carries_its_metadata_keys() -> None:
    for domain in REGISTRY:
        task = domain.make_tasks(1)[0]
        assert set(metadata_keys(domain)) <= set(task.metadata), domain.name


def test_params_become_plain_values() -> None:
    when = datetime.date(2026, 1, 1)
    assert plain_params({"extract": "tag", "since": when}) == {
        "extract": "tag",
        "since": "2026-01-01",
    }


async def test_answer_describes_the_named_domains_with_examples() -> None:
    catalog = Catalog(REGISTRY, validator="validator/test")
    reply = await catalog.answer(DomainsRequest(names=["tool_use"], examples=True), 1 << 20)
    [info] = reply.domains
    assert (info.name, info.kind, info.tools, info.max_turns) == (
        "tool_use",
        "tool_use",
        ["python"],
        4,
    )
    assert [(v.kind, v.weight) for v in info.validators] == [("exact", 0.8), ("tool_call", 0.2)]
    assert info.example is not None and info.example.domain == "tool_use"
    assert info.eval_size == 500 and info.eval_fraction == 0.2
    assert ANY.decode(ANY.encode(reply)) == reply


async def test_sizes_are_counted_within_the_budget_and_remembered() -> None:
    catalog = Catalog(REGISTRY, validator="v", budget_s=0.0)
    first = await catalog.answer(DomainsRequest(names=["arithmetic", "arithmetic_sum3"]), 1 << 20)
    # a+b and b+a are one problem: 12 of the 55 sums of two digits are held out.
    assert [d.eval_size for d in first.domains] == [12, None]
    second = await catalog.answer(DomainsRequest(names=["arithmetic", "arithmetic_sum3"]), 1 << 20)
    assert second.domains[0].eval_size == 12 and second.domains[1].eval_size is not None


async def test_an_unknown_name_is_a_bad_request_naming_it() -> None:
    catalog = Catalog(REGISTRY, validator="v")
    with pytest.raises(RequestRejected) as raised:
        await catalog.answer(DomainsRequest(names=["arithmetic", "nope"]), 1 << 20)
    assert (raised.value.code, raised.value.field) == (ErrorCode.BAD_REQUEST, "$.names[1]")


async def test_an_answer_over_the_payload_limit_is_refused() -> None:
    catalog = Catalog(REGISTRY, validator="v")
    with pytest.raises(RequestRejected) as raised:
        await catalog.answer(DomainsRequest(names=["arithmetic"], examples=True), 200)
    assert raised.value.code == ErrorCode.TOO_LARGE
    assert isinstance(
        await catalog.answer(DomainsRequest(names=["arithmetic"]), 1 << 20), DomainList
    )
