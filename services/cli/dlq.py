"""``temper dlq list|show|retry``: inspect dead letters and send them back where they came from."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.api import RawStreamMsg

from protocol import headers as h
from protocol import streams
from protocol.codec import ANY, encode
from protocol.errors import DecodeError
from protocol.messages import Task
from protocol.render import to_view
from services.cli.common import CliError, connect, emit_json, run

STREAM = streams.DEAD_LETTERS.name


def register(commands: Any) -> None:
    dlq = commands.add_parser("dlq", help="dead letters: list, show, retry")
    actions = dlq.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="one line per dead letter")
    listing.add_argument("--source", help="only from this stream or service")
    listing.add_argument("--limit", type=int, default=100)
    listing.set_defaults(run=cmd_list)
    show = actions.add_parser("show", help="headers and decoded body of one dead letter")
    show.add_argument("seq", type=int)
    show.set_defaults(run=cmd_show)
    retry = actions.add_parser(
        "retry",
        help="republish to the original subject (a task as its next attempt), then delete",
    )
    retry.add_argument("seq", type=int, nargs="*")
    retry.add_argument(
        "--all", action="store_true", help="retry every dead letter (with --source: of that source)"
    )
    retry.add_argument("--source", help="with --all: only from this stream or service")
    retry.set_defaults(run=cmd_retry)


async def entries(js: JetStreamContext, source: str | None = None) -> AsyncIterator[RawStreamMsg]:
    """Every stored dead letter, oldest first."""
    try:
        info = await js.stream_info(STREAM)
    except nats.js.errors.NotFoundError:
        return
    if info.state.messages == 0:
        return  # a new stream reports first_seq 0, which get_msg refuses
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        try:
            msg = await js.get_msg(STREAM, seq)
        except nats.js.errors.NotFoundError:
            continue  # deleted (retried) entries leave gaps
        if source is None or (msg.headers or {}).get(h.DLQ_SOURCE) == source:
            yield msg


def _line(msg: RawStreamMsg) -> str:
    hdrs = msg.headers or {}
    at = float(hdrs.get(h.DLQ_AT, "0") or 0)
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at)) if at else "-"
    reason = hdrs.get(h.DLQ_REASON, "")
    reason = reason if len(reason) <= 70 else reason[:67] + "..."
    return (
        f"{msg.seq:>6}  {when}  {hdrs.get(h.DLQ_SOURCE, '-'):<18} "
        f"{hdrs.get(h.DLQ_CODE, '-'):<20} "
        f"{len(msg.data or b''):>8}B  {reason}"
    )


def cmd_list(args: argparse.Namespace) -> int:
    async def go() -> int:
        nc = await connect(args.nats_url, "temper-dlq")
        shown = 0
        try:
            print(f"{'SEQ':>6}  {'WHEN':<19}  {'SOURCE':<18} {'CODE':<20} {'SIZE':>9}  REASON")
            async for msg in entries(nc.jetstream(), args.source):
                print(_line(msg))
                shown += 1
                if shown >= args.limit:
                    break
        finally:
            await nc.close()
        if shown == 0:
            print("no dead letters")
        return 0

    return run(go)


def cmd_show(args: argparse.Namespace) -> int:
    async def go() -> int:
        nc = await connect(args.nats_url, "temper-dlq")
        try:
            msg = await _get(nc, args.seq)
        finally:
            await nc.close()
        data = msg.data or b""
        record: dict[str, Any] = {
            "seq": msg.seq,
            "subject": msg.subject,
            "headers": dict(msg.headers or {}),
            "size": len(data),
        }
        try:
            record["message"] = to_view(ANY.decode(data))
        except DecodeError as error:
            record["undecodable"] = {
                "code": error.code.value,
                "message": error.message,
                "field": error.field,
            }
            record["original_hex"] = data[:4096].hex()
        emit_json(record)
        return 0

    return run(go)


async def _get(nc: NATS, seq: int) -> RawStreamMsg:
    if seq < 1:  # the server answers "bad request" to sequence 0
        raise CliError(f"no dead letter #{seq}", 2)
    try:
        return await nc.jetstream().get_msg(STREAM, seq)
    except nats.js.errors.NotFoundError:
        raise CliError(f"no dead letter #{seq}", 2) from None


def cmd_retry(args: argparse.Namespace) -> int:
    if not args.seq and not args.all:
        raise CliError("give dead-letter sequence numbers or --all", 2)

    async def go() -> int:
        nc = await connect(args.nats_url, "temper-dlq")
        retried = skipped = 0
        try:
            js = nc.jetstream()
            if args.all:
                targets = [m async for m in entries(js, args.source)]
            else:
                targets = [await _get(nc, s) for s in args.seq]
            for msg in targets:
                try:
                    await retry_one(js, msg)
                    retried += 1
                except CliError as error:  # one that cannot be retried must not stop the rest
                    print(f"temper: {error}", file=sys.stderr)
                    skipped += 1
        finally:
            await nc.close()
        left = f", {skipped} left in place" if skipped else ""
        print(f"retried {retried} dead letter(s){left}")
        return 1 if skipped else 0

    return run(go)


def next_attempt(data: bytes) -> bytes:
    """A dead-lettered task goes back as its next attempt, with new rollout ids that no
    dedup swallows; any other message goes back as it was."""
    try:
        message = ANY.decode(data)
    except DecodeError:
        return data
    if not isinstance(message, Task):
        return data
    return encode(msgspec.structs.replace(message, attempt=message.attempt + 1, not_before=None))


async def retry_one(js: JetStreamContext, msg: RawStreamMsg) -> None:
    """Republish the original bytes to the original subject, then delete the dead letter."""
    seq = msg.seq or 0
    hdrs = dict(msg.headers or {})
    subject = hdrs.get(h.DLQ_SUBJECT)
    if not subject:
        raise CliError(f"dead letter #{msg.seq} has no {h.DLQ_SUBJECT} header; cannot retry")
    if h.DLQ_TRUNCATED in hdrs:
        raise CliError(f"dead letter #{msg.seq} kept only part of the original; cannot retry")
    original = {k: v for k, v in hdrs.items() if not k.startswith("Temper-Dlq-") and k != h.MSG_ID}
    original[h.MSG_ID] = f"retry:{msg.seq}:{time.time_ns()}"
    try:
        await js.publish(subject, next_attempt(msg.data or b""), headers=original)
    except (nats.js.errors.NoStreamResponseError, nats.errors.NoRespondersError):
        # A rejected request (source: a service) has no stream to go back to.
        raise CliError(
            f"dead letter #{msg.seq}: no stream captures {subject}; cannot retry"
        ) from None
    await js.delete_msg(STREAM, seq)
