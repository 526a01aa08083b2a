"""``temper domains`` and ``temper.v1.domains``, answered by a real validator over NATS."""

from __future__ import annotations

import json

from nats.aio.client import Client as NATS

from protocol import subjects
from protocol.codec import Codec, encode
from protocol.errors import ErrorCode
from protocol.messages import DomainList, DomainsRequest, ErrorReply
from services.validator.service import ValidatorService
from services.validator.settings import ValidatorSettings
from tests.integration.support import client, runtime
from tests.integration.test_cli_harness import free_port, temper

REPLIES: Codec[DomainList | ErrorReply] = Codec(DomainList | ErrorReply)


def validator(url: str) -> ValidatorService:
    return ValidatorService(ValidatorSettings(runtime=runtime(url, instance="val-domains")))


async def ask_until_counted(nc: NATS, rounds: int = 10) -> list[DomainList]:
    """Ask until every held-out size is counted (each answer counts for a bounded time)."""
    answers: list[DomainList] = []
    for _ in range(rounds):
        msg = await nc.request(subjects.domains(), encode(DomainsRequest()), timeout=60)
        listing = REPLIES.decode(msg.data)
        assert isinstance(listing, DomainList)
        answers.append(listing)
        if all(d.eval_size is not None for d in listing.domains):
            break
    return answers


async def test_the_validator_answers_on_the_domains_subject(nats_url: str) -> None:
    async with validator(nats_url), client(nats_url) as nc:
        answers = await ask_until_counted(nc)
        bad = await nc.request(subjects.domains(), encode(DomainsRequest(names=["x"])), timeout=5)
    first, last = answers[0], answers[-1]
    assert [d.name for d in first.domains][:2] == ["arithmetic", "arithmetic_sum3"]
    assert first.validator == "validator/val-domains"
    assert first.domains[0].eval_size == 12
    assert all(d.eval_size is not None and d.eval_size > 0 for d in last.domains)
    error = REPLIES.decode(bad.data)
    assert isinstance(error, ErrorReply)
    assert (error.code, error.field) == (ErrorCode.BAD_REQUEST, "$.names[0]")


async def test_temper_domains_prints_json_and_text(nats_url: str) -> None:
    async with validator(nats_url):
        as_json = await temper(nats_url, "domains", "--json", timeout_s=60)
        as_text = await temper(nats_url, "domains", "doc_numeric_qa", "--examples")
        unknown = await temper(nats_url, "domains", "nope")
    assert as_json.code == 0, as_json.err
    listing = json.loads(as_json.out)
    assert listing["type"] == "domain_list"
    by_name = {d["name"]: d for d in listing["domains"]}
    assert by_name["python_functions"]["metadata_keys"] == ["calls", "expected"]
    assert by_name["doc_numeric_qa"]["metadata_keys"] == ["document", "answer"]
    assert as_text.code == 0, as_text.err
    assert "metadata    document, answer" in as_text.out and "example     id" in as_text.out
    assert unknown.code == 1 and "not served here" in unknown.err


async def test_without_a_validator_it_says_so_and_local_still_works() -> None:
    url = f"nats://127.0.0.1:{free_port()}"
    down = await temper(url, "domains")
    assert down.code == 1 and "cannot reach NATS" in down.err
    local = await temper(url, "domains", "--local", "--json", "arithmetic")
    assert local.code == 0, local.err
    [arithmetic] = json.loads(local.out)["domains"]
    assert arithmetic["prompt_template"] == "{question}=" and arithmetic["eval_size"] == 12


async def test_no_responders_is_a_clear_error(nats_url: str) -> None:
    done = await temper(nats_url, "domains", "--timeout", "1")
    assert done.code == 1 and "no validator answered" in done.err
