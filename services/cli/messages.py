"""``temper submit``, ``tail``, ``record``, ``replay``: put messages in, watch them, replay them."""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import sys
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Annotated, Any, TextIO, TypeVar

import msgspec
import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from protocol import headers as h
from protocol.client import (
    DEFAULT_RECONNECT_S,
    Receipt,
    StackUnavailable,
    Submission,
    TemperClient,
)
from protocol.client.submission import Tally
from protocol.codec import ANY, field_path
from protocol.errors import DecodeError, ProtocolError
from protocol.messages import Task
from protocol.packed import pack_i32
from protocol.render import to_view
from services.cli.common import CliError, connect, emit_json, run, stop_event, until
from services.cli.submit_view import WaitView

T = TypeVar("T")
#: A token id of the ``prompt_tokens`` shorthand: what fits the packed ``<i4`` layout.
TokenId = Annotated[int, msgspec.Meta(ge=-(2**31), le=2**31 - 1)]


def register(commands: Any) -> None:
    submit = commands.add_parser(
        "submit", help="submit tasks from a JSONL file (one Task per line)"
    )
    submit.add_argument("file", type=Path, help="JSONL; '-' reads standard input")
    submit.add_argument("--wait", action="store_true", help="wait for every task's scored rollouts")
    submit.add_argument("--timeout", type=float, default=600.0, help="seconds to wait with --wait")
    _reconnect_option(submit)
    submit.set_defaults(run=cmd_submit)

    tail = commands.add_parser("tail", help="print decoded messages on SUBJECT (wildcards allowed)")
    tail.add_argument("subject", help="e.g. 'temper.v1.>' or 'temper.v1.task.>'")
    tail.add_argument("--count", type=int, default=0, help="stop after N messages")
    tail.add_argument("--raw", action="store_true", help="show packed arrays as base64")
    _reconnect_option(tail)
    tail.set_defaults(run=cmd_tail)

    record = commands.add_parser(
        "record", help="record SUBJECT to FILE (JSONL) for `temper replay`"
    )
    record.add_argument("subject")
    record.add_argument("file", type=Path)
    record.add_argument("--count", type=int, default=0, help="stop after N messages")
    record.add_argument("--duration", type=float, default=0.0, help="stop after S seconds")
    record.set_defaults(run=cmd_record)

    replay = commands.add_parser(
        "replay", help="publish a recorded FILE again (to debug one service alone)"
    )
    replay.add_argument("file", type=Path)
    replay.add_argument("--subject", help="publish everything to this subject instead")
    replay.add_argument(
        "--rate", type=float, default=0.0, help="messages per second (0: as fast as possible)"
    )
    replay.add_argument(
        "--keep-ids",
        action="store_true",
        help="keep Nats-Msg-Id headers (the stream then drops what it has already seen)",
    )
    replay.set_defaults(run=cmd_replay)


def _reconnect_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--reconnect-timeout",
        type=float,
        default=DEFAULT_RECONNECT_S,
        metavar="S",
        help="when NATS goes away (a restarted nats-server comes back by itself), "
        "keep trying this many seconds before giving up (default %(default)g)",
    )


async def _client(url: str, name: str, reconnect_s: float) -> TemperClient:
    try:
        return await TemperClient.connect(
            url, name=name, connect_timeout_s=3, reconnect_s=reconnect_s
        )
    except StackUnavailable as error:
        raise CliError(str(error)) from None


# ---------------------------------------------------------------- submit


def parse_task(line: str, number: int) -> Task:
    """One JSONL line -> Task.

    Shorthands: ``prompt`` as a string, ``prompt_tokens`` as a list, no ``id``.
    """
    try:
        raw = json.loads(line)
    except ValueError as error:
        raise CliError(f"line {number}: not JSON ({error})", 2) from None
    if not isinstance(raw, dict):
        raise CliError(f"line {number}: expected a JSON object, got {type(raw).__name__}", 2)
    raw.setdefault("id", uuid.uuid4().hex)
    if isinstance(raw.get("prompt"), str):
        raw["prompt"] = [{"role": "user", "content": raw["prompt"]}]
    raw.pop("type", None)
    tokens = raw.get("prompt_tokens")
    if isinstance(tokens, list):
        raw["prompt_tokens"] = pack_i32(_convert(tokens, list[TokenId], number, "$.prompt_tokens"))
    return _convert(raw, Task, number, "$")


def _convert(value: Any, type_: type[T], number: int, root: str) -> T:
    try:
        return msgspec.convert(value, type_)
    except msgspec.ValidationError as error:
        path, message = field_path(error)
        path = root + path.removeprefix("$")
        raise CliError(f"line {number}: invalid task: {message} (at {path})", 2) from None


def read_tasks(stream: TextIO) -> Iterator[Task]:
    for number, line in enumerate(stream, start=1):
        if line.strip() and not line.lstrip().startswith("#"):
            yield parse_task(line, number)


def cmd_submit(args: argparse.Namespace) -> int:
    if str(args.file) == "-":
        tasks = list(read_tasks(sys.stdin))
    else:
        if not args.file.is_file():
            raise CliError(f"{args.file}: no such file", 2)
        with args.file.open() as handle:
            tasks = list(read_tasks(handle))
    return run(
        lambda: _submit(args.nats_url, tasks, args.wait, args.timeout, args.reconnect_timeout)
    )


async def _submit(
    url: str, tasks: list[Task], wait: bool, timeout_s: float, reconnect_s: float
) -> int:
    client = await _client(url, "temper-submit", reconnect_s)
    async with client:
        try:
            if not wait:
                _print_receipts(await client.submit_many(tasks))
                return 0
            submission = await client.submit_all(tasks)
            _print_receipts(submission.receipts)
            await _wait_all(client, submission, timeout_s)
        except ProtocolError as error:
            raise CliError(str(error)) from None
    return 0


def _print_receipts(receipts: Iterable[Receipt]) -> None:
    for receipt in receipts:
        note = " (duplicate: already submitted)" if receipt.duplicate else ""
        print(
            f"submitted {receipt.task_id} -> {receipt.stream} #{receipt.seq} "
            f"trace {receipt.trace_id}{note}",
            flush=True,  # receipts show at once, not when --wait ends
        )


async def _wait_all(client: TemperClient, submission: Submission, timeout_s: float) -> None:
    """Every result as it arrives, through one consumer however many tasks there are."""
    view = WaitView(Tally(submission.tasks).progress)
    try:
        await client.wait_all(submission, timeout_s=timeout_s, on_result=view.result)
    except TimeoutError as error:
        raise CliError(str(error) or f"timed out after {timeout_s}s") from None
    finally:
        view.close()


# ---------------------------------------------------------------- tail


def cmd_tail(args: argparse.Namespace) -> int:
    return run(
        lambda: _tail(args.nats_url, args.subject, args.count, args.raw, args.reconnect_timeout)
    )


def describe(msg: Msg, raw: bool) -> dict[str, Any]:
    """A received message as one JSON-able record.

    Subject, trace id, size, and the decoded body or the decode error.
    """
    hdrs = msg.headers or {}
    record: dict[str, Any] = {
        "subject": msg.subject,
        "trace_id": hdrs.get(h.TRACE_ID, ""),
        "size": len(msg.data),
    }
    try:
        message = ANY.decode(msg.data)
    except DecodeError as error:
        record["error"] = {"code": error.code.value, "message": error.message, "field": error.field}
        return record
    record["message"] = msgspec.to_builtins(message) if raw else to_view(message)
    return record


async def _tail(url: str, subject: str, count: int, raw: bool, reconnect_s: float) -> int:
    client = await _client(url, "temper-tail", reconnect_s)
    stop = stop_event()
    seen = 0
    async with client, contextlib.aclosing(client.messages(subject)) as messages:
        while not stop.is_set() and (count == 0 or seen < count):
            try:
                msg = await until(stop, anext(messages))
            except StackUnavailable as error:
                raise CliError(str(error)) from None
            if msg is None:
                break
            emit_json(describe(msg, raw))
            seen += 1
    return 0


# ---------------------------------------------------------------- record / replay


def to_record(msg: Msg) -> dict[str, Any]:
    return {
        "subject": msg.subject,
        "headers": dict(msg.headers or {}),
        "data": base64.b64encode(msg.data).decode(),
        "received_at": time.time(),
    }


def cmd_record(args: argparse.Namespace) -> int:
    return run(lambda: _record(args.nats_url, args.subject, args.file, args.count, args.duration))


async def _record(url: str, subject: str, path: Path, count: int, duration_s: float) -> int:
    nc = await connect(url, "temper-record")
    stop = stop_event()
    deadline = time.monotonic() + duration_s if duration_s else None
    seen = 0
    try:
        sub = await nc.subscribe(subject)
        with path.open("a") as out:
            while not stop.is_set() and (count == 0 or seen < count):
                left = deadline - time.monotonic() if deadline else None
                if left is not None and left <= 0:
                    break
                try:
                    msg = await until(stop, sub.next_msg(timeout=left))
                except (TimeoutError, nats.errors.TimeoutError):
                    break
                if msg is None:
                    break
                out.write(json.dumps(to_record(msg)) + "\n")
                out.flush()
                seen += 1
    finally:
        await nc.close()
    print(f"recorded {seen} messages to {path}", file=sys.stderr)
    return 0


def read_records(path: Path) -> Iterator[dict[str, Any]]:
    with path.open() as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                record["data"] = base64.b64decode(record["data"], validate=True)
                _check_record(record)
            except (ValueError, KeyError, TypeError) as error:
                raise CliError(f"{path}:{number}: not a recorded message ({error})", 2) from None
            yield record


def _check_record(record: dict[str, Any]) -> None:
    if not isinstance(record.get("subject"), str) or not record["subject"]:
        raise ValueError("no subject")
    headers = record.get("headers") or {}
    if not isinstance(headers, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
    ):
        raise ValueError("headers must map strings to strings")


def cmd_replay(args: argparse.Namespace) -> int:
    if not args.file.is_file():
        raise CliError(f"{args.file}: no such file", 2)
    records = list(read_records(args.file))
    return run(lambda: _replay(args.nats_url, records, args.subject, args.rate, args.keep_ids))


async def _replay(
    url: str, records: list[dict[str, Any]], subject: str | None, rate: float, keep_ids: bool
) -> int:
    nc = await connect(url, "temper-replay")
    js = nc.jetstream()
    captured: dict[str, bool] = {}
    durable = core = 0
    try:
        for record in records:
            hdrs = {
                k: v for k, v in (record.get("headers") or {}).items() if keep_ids or k != h.MSG_ID
            }
            target = subject or record["subject"]
            if await _in_stream(js, target, captured):
                await js.publish(target, record["data"], headers=hdrs or None)
                durable += 1
            else:
                await nc.publish(target, record["data"], headers=hdrs or None)
                core += 1
            if rate > 0:
                await asyncio.sleep(1.0 / rate)
        await nc.flush()
    finally:
        await nc.close()
    print(
        f"replayed {durable + core} messages ({durable} into streams, {core} as plain NATS)",
        file=sys.stderr,
    )
    return 0


async def _in_stream(js: JetStreamContext, subject: str, known: dict[str, bool]) -> bool:
    """Whether a stream captures ``subject`` (asked once per subject).

    Decided before publishing: a JetStream publish is a request, so on a subject with no
    stream a plain subscriber (a service's request handler) would get it and never ack it.
    """
    if subject not in known:
        try:
            await js.find_stream_name_by_subject(subject)
            known[subject] = True
        except (
            nats.js.errors.NotFoundError,
            nats.js.errors.ServiceUnavailableError,
            nats.errors.NoRespondersError,
        ):
            known[subject] = False
    return known[subject]
