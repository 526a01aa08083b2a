"""Fuzz: malformed messages on every subject a service consumes, against real processes.

Every service runs as its own process (``temper serve NAME``, as under ``temper up``) on
a real nats-server.  Over 10,000 malformed messages go to every subject one of them
consumes: random bytes, truncated MessagePack, wrong types, wrong versions (nested ones
too), missing fields, other message types, unknown tags, non-maps, deep nesting,
oversized payloads, and payloads at the server's size limit.  The consumed subjects are
read from the server itself (JetStream consumers, and the services' subscriptions), and
must all be in the table here, so a subject added later cannot go unfuzzed.  Each message
is decoded here first with the codec its subject is read with: it must fail, and its
error code is what the service must report (for a wrong version, nested or not, the
mutation itself says what: the codec is under test too).  A message over the size limit
never reaches a service: the client refuses it (see test_runtime_bad_input.py).

Asserted: no service process died, and each answers its health probe; every stream
message is dead-lettered exactly once with its reason and its original bytes (cut only
when the original was at the size limit, and then marked), and its stream holds nothing
unacked; every request gets a typed ErrorReply with the expected code; every message on
an event subject gets an ErrorEvent and a dead letter.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import time
import typing
import urllib.request
from collections import defaultdict
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import msgspec
import msgspec.inspect as mi
import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from protocol import headers as h
from protocol import streams, subjects
from protocol.codec import ANY, Codec, encode, headers_size
from protocol.errors import DecodeError, ErrorCode
from protocol.messages import (
    MESSAGE_TYPES,
    BatchCommit,
    CallCancel,
    DomainControl,
    DomainsRequest,
    ErrorEvent,
    ErrorReply,
    Heartbeat,
    LeaseRelease,
    Message,
    PolicyUpdate,
    Rollout,
    SampleRequest,
    SandboxClose,
    SandboxExec,
    SandboxOpen,
    SandboxSnapshotRequest,
    ScoredRollout,
    Stats,
    StatusRequest,
    Task,
    WeightSyncAck,
)
from services.runtime.bus import Bus, ConnectOptions, Publication
from services.runtime.natsserver import RANDOM_PORT, NatsServer, NatsServerSettings
from services.runtime.procs import child_preexec
from tests.golden.examples import examples
from tests.integration.support import client
from tests.integration.test_cli_harness import ROOT, free_port

SEED = 13
#: Small enough that payloads at the limit are cheap to make; above the sandbox's code limit.
MAX_PAYLOAD = 1 << 20
SANDBOX_MAX_CODE_BYTES = 64 * 1024
SERVICES = ("control", "sandbox", "validator", "generator", "replay", "learner")
START_TIMEOUT_S = 60.0
SETTLE_TIMEOUT_S = 60.0
REQUEST_TIMEOUT_S = 20.0
#: Requests in flight at once (publishes to streams go out in pipelined chunks).
REQUESTS_AT_ONCE = 48
PUBLISH_CHUNK = 400
#: Per target: payloads of a few hundred KiB, and (streams) payloads at the size limit.
OVERSIZED_PER_TARGET = 2
AT_LIMIT_PER_STREAM = 1

HEARTBEATS: Codec[Heartbeat] = Codec(Heartbeat)
EVENTS: Codec[ErrorEvent] = Codec(ErrorEvent)

Kind = Literal["stream", "request", "event", "probe"]
#: Log events of services.runtime when handling a message went wrong.
RUNTIME_FAILURES = {
    "delivery_failed",
    "handler_failed",
    "reply_failed",
    "error_event_failed",
    "exhausted_dead_letter_failed",
    "service_failed",
}


# ---------------------------------------------------------------- what each subject takes


@dataclass(frozen=True)
class Target:
    """One consumed subject: where its fuzz goes and what it is read as."""

    kind: Kind
    #: Stream name (kind ``stream``), else the subject as the services subscribe to it.
    key: str
    #: Where the fuzz messages are published.
    subject: str
    #: The type the subject is decoded as; ``None``: the payload is not read (probes).
    type_: Any
    count: int


def table(sandbox_instance: str) -> list[Target]:
    """Every subject a service consumes (see their ``setup()``), with what it is read as.

    Subjects no running service consumes are left out when the suite runs; a consumed
    subject missing here fails it.
    """
    tasks = [
        Target("stream", streams.task_stream_name(t), subjects.task(t, "fuzz"), Task, 750)
        for t in range(len(streams.TASK_STREAMS))
    ]
    instance = subjects.sandbox_instance(sandbox_instance)
    instance_type = SandboxExec | SandboxSnapshotRequest | SandboxClose
    probes = [
        Target("probe", subjects.health(name), subjects.health(name), None, 30) for name in SERVICES
    ]
    return [
        *tasks,
        Target("stream", streams.ROLLOUTS.name, subjects.rollout("fuzz"), Rollout, 1700),
        Target("stream", streams.SCORED.name, subjects.scored("fuzz", "t1"), ScoredRollout, 1700),
        _request(subjects.sandbox_exec(), SandboxExec, 500),
        _request(subjects.sandbox_session(), SandboxOpen, 500),
        Target("request", instance, instance, instance_type, 400),
        _request(subjects.replay_sample(), SampleRequest, 500),
        _request(subjects.replay_commit(), BatchCommit | LeaseRelease, 300),
        _request(subjects.status(), StatusRequest, 300),
        _request(subjects.domains(), DomainsRequest, 400),
        _request(subjects.domain_control(), DomainControl, 300),
        _event(subjects.policy_update(), PolicyUpdate, 500),
        # Generators hear the gateway's cancels of calls.
        _event(subjects.gateway_cancel(), CallCancel, 300),
        _event(subjects.weight_ack("generator"), WeightSyncAck, 300),
        # Generators read the sandbox pool's free sessions from its stats.
        _event(subjects.stats("sandbox"), Stats, 300),
        Target("event", subjects.heartbeats(), subjects.heartbeat("fuzz"), Heartbeat, 400),
        Target("probe", subjects.ping(), subjects.ping(), None, 100),
        *probes,
    ]


#: Subjects services only watch (``listen(observer=True)``: they never reply and leave
#: bad input to the stream's consumer), by the stream whose fuzz reaches them too.
OBSERVED = {subjects.scored_all(): streams.SCORED.name}


def observed(known: list[Target]) -> set[str]:
    """The watched subjects whose stream is fuzzed: a bad message there must crash no
    watcher, and the stream's consumer alone dead-letters it."""
    streams_fuzzed = {t.key for t in known if t.kind == "stream"}
    return {subject for subject, stream in OBSERVED.items() if stream in streams_fuzzed}


def _request(subject: str, type_: Any, count: int) -> Target:
    return Target("request", subject, subject, type_, count)


def _event(subject: str, type_: Any, count: int) -> Target:
    return Target("event", subject, subject, type_, count)


# ---------------------------------------------------------------- what the server says


@dataclass(frozen=True)
class Consumed:
    """Streams with consumers (stream -> consumer names) and what the services subscribe to
    (subject -> one entry per receiver: the service, or ``service@queue`` for a queue group)."""

    streams: dict[str, set[str]]
    subscriptions: dict[str, set[str]]

    def keys(self) -> set[str]:
        return set(self.streams) | set(self.subscriptions)

    def receivers(self, target: Target) -> list[str]:
        """The services one message to ``target`` reaches (one per queue group)."""
        if target.kind == "stream":
            return [target.key]
        seen = sorted(self.subscriptions.get(target.key, ()))
        groups = {entry.split("@")[1]: entry.split("@")[0] for entry in seen if "@" in entry}
        return sorted([entry for entry in seen if "@" not in entry] + list(groups.values()))


async def discover(nc: NATS, monitor: str) -> Consumed:
    jsm = nc.jsm()
    consumed: dict[str, set[str]] = {}
    for info in await jsm.streams_info():
        stream = info.config.name or ""
        names = {c.name or "" for c in await jsm.consumers_info(stream)}
        if names:
            consumed[stream] = names
    url = f"{monitor}/connz?subs=detail&limit=1024"
    connz = await asyncio.to_thread(lambda: json.load(urllib.request.urlopen(url, timeout=5)))
    subscribed: dict[str, set[str]] = defaultdict(set)
    for conn in connz["connections"]:
        name = conn.get("name") or ""
        if not name.startswith("temper-"):
            continue
        service = name.removeprefix("temper-").split("-")[0]
        wakes: set[str] = set()
        if service == "generator":
            # Its fair intake makes a durable per domain as that domain's tasks arrive, and
            # listens on an idle tier's subjects (payloads unread) for a publish: the task
            # streams' fuzz covers both.
            for tier, spec in enumerate(streams.TASK_STREAMS):
                consumed.setdefault(spec.name, set())
                wakes.add(subjects.task_tier(tier))
        for sub in conn.get("subscriptions_list_detail", []):
            # Reply inboxes and the server's own advisories are not input from anyone.
            if not sub["subject"].startswith(("_INBOX.", "$")) and sub["subject"] not in wakes:
                queue = sub.get("qgroup")
                subscribed[sub["subject"]].add(f"{service}@{queue}" if queue else service)
    return Consumed(consumed, dict(subscribed))


# ---------------------------------------------------------------- malformed messages


@dataclass(frozen=True)
class Bad:
    """One fuzz message and what the service must make of it."""

    target: Target
    trace: str
    mutation: str
    data: bytes
    #: The code (and field) the service must report; ``None``: the payload is not read.
    code: ErrorCode | None
    field: str | None
    #: False for a request that decodes but is refused (over the sandbox's code limit).
    dead_lettered: bool = True

    @property
    def at_limit(self) -> bool:
        return self.mutation == "at_limit"


MUTATIONS = (
    "random_bytes",
    "truncated",
    "wrong_type",
    "wrong_version",
    "nested_version",
    "missing_field",
    "wrong_message",
    "unknown_tag",
    "not_a_map",
    "deep",
)
BAD_VERSIONS = (0, 2, 3, 99, -1, 1 << 40)
WRONG_VALUES: tuple[object, ...] = (7, -1, 1.5, "x", b"\x00\xff", [1, "a"], {"k": 1}, None, True)
BAD_TAGS = ("nope", "Task", "", "task.v2", "x" * 200)
NOT_MAPS: tuple[object, ...] = ([], [1, 2], 7, "task", None, True, 1.5, b"raw")
Path_ = tuple[str | int, ...]


def pack(value: object) -> bytes:
    return msgspec.msgpack.encode(value)


def members(type_: Any) -> tuple[type[Message], ...]:
    return typing.get_args(type_) or (type_,)


def tag_of(cls: type[Message]) -> str:
    return str(cls.__struct_config__.tag)


def paths(value: object, prefix: Path_ = ()) -> Iterator[Path_]:
    """Every value's path inside plain maps and arrays (the root excluded)."""
    items: Any = (
        value.items()
        if isinstance(value, dict)
        else enumerate(value)
        if isinstance(value, list)
        else ()
    )
    for key, child in items:
        yield (*prefix, key)
        yield from paths(child, (*prefix, key))


def field_path(path: Path_) -> str:
    """``$.rollout.task.v``, ``$.items[1].v``: the way errors name a field."""
    return "$" + "".join(f"[{step}]" if isinstance(step, int) else f".{step}" for step in path)


def at(value: Any, path: Path_) -> Any:
    for step in path:
        value = value[step]
    return value


class Fuzzer:
    """Makes malformed variants of valid messages (the golden examples), seeded."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.plain = {tag: msgspec.msgpack.decode(encode(m)) for tag, m in examples().items()}
        #: The (code, field) the last message must get, where its mutation decides it.
        self.claim: tuple[ErrorCode, str] | None = None

    def base(self, type_: Any) -> dict[str, Any]:
        """A valid message of ``type_`` as a plain map (fresh: mutations change it)."""
        tag = tag_of(self.rng.choice(members(type_)))
        value = self.plain.get(tag, {"type": tag, "v": 1})
        return msgspec.msgpack.decode(pack(value))  # type: ignore[no-any-return]

    def make(self, mutation: str, type_: Any) -> bytes:
        """``mutation`` applied to a valid ``type_``; sets :attr:`claim` when the mutation
        alone decides the error (the expectation then does not rest on the codec)."""
        rng, value = self.rng, self.base(type_)
        self.claim = None
        if mutation == "random_bytes":
            return rng.randbytes(rng.randint(0, 256))
        if mutation == "truncated":
            good = pack(value)
            return good[: rng.randrange(len(good))]
        if mutation == "wrong_type":
            path = rng.choice(list(paths(value)))
            parent = at(value, path[:-1])
            parent[path[-1]] = rng.choice(
                [v for v in WRONG_VALUES if type(v) is not type(parent[path[-1]])]
            )
        elif mutation in ("wrong_version", "nested_version"):
            return self.version(value, nested=mutation == "nested_version")
        elif mutation == "missing_field":
            cls = MESSAGE_TYPES[value["type"]]
            fields = mi.type_info(cls).fields  # type: ignore[attr-defined]
            required = [f.encode_name for f in fields if f.required and f.encode_name in value]
            del value[rng.choice(required) if required else "type"]
        elif mutation == "wrong_message":
            accepted = {tag_of(c) for c in members(type_)}
            return pack(self.plain[rng.choice(sorted(set(self.plain) - accepted))])
        elif mutation == "unknown_tag":
            value["type"] = rng.choice(BAD_TAGS)
        elif mutation == "not_a_map":
            return pack(rng.choice(NOT_MAPS))
        elif mutation == "deep":
            return self.deep(value)
        return pack(value)

    def version(self, value: dict[str, Any], *, nested: bool) -> bytes:
        """Another version at the top, or in a message nested in it (at the top when none is)."""
        inner = [p for p in paths(value) if isinstance(at(value, p), dict) and "v" in at(value, p)]
        path = self.rng.choice(inner) if nested and inner else ()
        at(value, path)["v"] = self.rng.choice(BAD_VERSIONS)
        self.claim = (ErrorCode.UNSUPPORTED_VERSION, field_path((*path, "v")))
        return pack(value)

    def deep(self, value: dict[str, Any]) -> bytes:
        """One field replaced by arrays nested 100 to 5,000 deep, around and past the
        recursion limit (packed by hand: the encoder would hit that limit itself)."""
        key = self.rng.choice(sorted(value))
        del value[key]
        value[key] = None  # packed last, as the one byte 0xc0
        return pack(value)[:-1] + b"\x91" * self.rng.randint(100, 5_000) + b"\xc0"

    def oversized(self, type_: Any) -> bytes:
        """Hundreds of KiB: a huge unknown tag, a huge id, or a huge blob beside a bad version."""
        value, size = self.base(type_), self.rng.randint(MAX_PAYLOAD // 8, MAX_PAYLOAD // 4)
        choice = self.rng.randrange(3)
        if choice == 0:
            value["type"] = "x" * size
        elif choice == 1:
            value["id"] = "i" * size
            value["type"] = "task" if value["type"] != "task" else "rollout"
        else:
            value["blob"] = self.rng.randbytes(size)
            value["v"] = 2
        return pack(value)

    @staticmethod
    def at_limit(hdrs: Mapping[str, str]) -> bytes:
        """A MessagePack bin that, with ``hdrs``, is exactly the server's max_payload."""
        size = MAX_PAYLOAD - headers_size(hdrs) - 5
        return b"\xc6" + size.to_bytes(4, "big") + bytes(size)


def corpus(fuzzer: Fuzzer, chosen: list[Target]) -> list[Bad]:
    """``count`` malformed messages per target, every mutation on every subject."""
    out: list[Bad] = []
    for target in chosen:
        codec: Codec[Any] | None = Codec(target.type_) if target.type_ is not None else None
        for index in range(target.count):
            trace = f"fz-{len(out):05d}"
            out.append(_one(fuzzer, target, codec, index, trace))
        if target.key == subjects.sandbox_exec():
            out += _too_large_code(target, len(out))
    return out


def _one(fuzzer: Fuzzer, target: Target, codec: Codec[Any] | None, index: int, trace: str) -> Bad:
    if target.kind == "stream" and index < AT_LIMIT_PER_STREAM:
        mutation, data = "at_limit", fuzzer.at_limit(stream_headers(trace))
    elif index < AT_LIMIT_PER_STREAM + OVERSIZED_PER_TARGET:
        mutation, data = "oversized", fuzzer.oversized(target.type_ or Task)
    else:
        mutation = MUTATIONS[index % len(MUTATIONS)]
        data = fuzzer.make(mutation, target.type_ or Task)
    if codec is None:
        return Bad(target, trace, mutation, data, None, None)
    # A mutation may leave the message valid (an int where a float goes): make another, and
    # after a few tries another kind (nothing is missing from a message without fields).
    for attempt in range(1, 50):
        if fuzzer.claim is not None:
            return Bad(target, trace, mutation, data, *fuzzer.claim)
        error = _decode_error(codec, data)
        if error is not None:
            return Bad(target, trace, mutation, data, error.code, error.field)
        mutation = MUTATIONS[(index + attempt // 5) % len(MUTATIONS)]
        data = fuzzer.make(mutation, target.type_)
    raise AssertionError(f"{mutation} on {target.key} keeps making valid messages")


def _decode_error(codec: Codec[Any], data: bytes) -> DecodeError | None:
    try:
        codec.decode(data)
    except DecodeError as error:
        return error
    return None


def _too_large_code(target: Target, first: int) -> list[Bad]:
    """Valid SandboxExecs over the sandbox's code limit: refused with ``too_large``."""
    out = []
    for index in range(OVERSIZED_PER_TARGET):
        request = SandboxExec(id=f"big-{index}", code="x" * (SANDBOX_MAX_CODE_BYTES + 1 + index))
        trace = f"fz-{first + index:05d}"
        out.append(
            Bad(
                target,
                trace,
                "too_large_code",
                encode(request),
                ErrorCode.TOO_LARGE,
                "$.code",
                False,
            )
        )
    return out


def stream_headers(trace: str) -> dict[str, str]:
    return {h.TRACE_ID: trace, h.MSG_ID: trace}


# ---------------------------------------------------------------- the stack, as processes


@dataclass
class Stack:
    url: str
    monitor: str
    procs: dict[str, asyncio.subprocess.Process]
    logs: Path

    def dead(self) -> dict[str, int]:
        """Services whose process has ended, with their exit codes."""
        return {n: p.returncode for n, p in self.procs.items() if p.returncode is not None}

    def failures(self) -> list[str]:
        """Log lines of the runtime failing to handle a message (each would also lose or
        delay it): what a malformed message must never cause."""
        found = []
        for name in self.procs:
            for line in (self.logs / f"{name}.log").read_text(errors="replace").splitlines():
                with contextlib.suppress(ValueError, AttributeError):
                    if json.loads(line).get("event") in RUNTIME_FAILURES:
                        found.append(f"{name}: {line}")
        return found

    def log_tail(self, name: str, lines: int = 20) -> str:
        text = (self.logs / f"{name}.log").read_text(errors="replace")
        return "\n".join(text.splitlines()[-lines:])


def service_env(name: str, url: str, tmp: Path, sockets: Path, model: Path) -> dict[str, str]:
    env = {
        **os.environ,
        "TEMPER_NATS_URL": url,
        "TEMPER_INSTANCE": f"fuzz-{name}",
        "TEMPER_HEARTBEAT_S": "1",
        "TEMPER_STATS_S": "5",
        "TEMPER_GRACE_S": "2",
        # Every rejection is a warning: at this volume their lines would cost CPU time.
        "TEMPER_LOG_LEVEL": "error",
    }
    per_service = {
        "generator": {
            "TEMPER_GENERATOR_MODEL": str(model),
            "TEMPER_GENERATOR_THREADS": "1",
            "TEMPER_GENERATOR_TUNE_LINEARS": "false",
            # Sandbox tools: the generator then also reads the sandbox's stats.
            "TEMPER_GENERATOR_TOOLS": "sandbox",
            "TEMPER_GENERATOR_MAX_CONCURRENT_TASKS": "16",
            "TEMPER_GENERATOR_FETCH_WAIT_S": "0.2",
        },
        "learner": {
            "TEMPER_LEARNER_MODEL": str(model),
            "TEMPER_LEARNER_OUT_DIR": str(tmp / "learner"),
            "TEMPER_LEARNER_THREADS": "1",
            "TEMPER_LEARNER_TENSORBOARD": "false",
        },
        # No fuzz message ever runs: the plain-subprocess backend needs neither Docker nor bwrap.
        "sandbox": {
            "TEMPER_SANDBOX_BACKEND": "subprocess",
            "TEMPER_SANDBOX_POOL_SIZE": "1",
            "TEMPER_SANDBOX_MAX_CODE_BYTES": str(SANDBOX_MAX_CODE_BYTES),
            "TEMPER_SANDBOX_STATE_DIR": str(sockets),
            "TEMPER_SANDBOX_SNAPSHOT_DIR": str(tmp / "snapshots"),
        },
        "validator": {
            "TEMPER_VALIDATOR_FETCH_WAIT_S": "0.2",
            "TEMPER_VALIDATOR_DOMAIN_PLUGINS": "false",
        },
    }
    env.update(per_service.get(name, {}))
    return env


async def spawn(name: str, env: Mapping[str, str], logs: Path) -> asyncio.subprocess.Process:
    with (logs / f"{name}.log").open("ab") as log:
        return await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "services",
            "serve",
            name,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            cwd=ROOT,
            env=dict(env),
            preexec_fn=child_preexec(),
        )


async def healthy(nc: NATS, name: str) -> Heartbeat | None:
    try:
        reply = await nc.request(subjects.health(name), b"", timeout=1.0)
    except Exception:  # not up yet, or gone: the caller decides
        return None
    beat = HEARTBEATS.decode(reply.data)
    return beat if beat.healthy else None


async def wait_healthy(stack: Stack, nc: NATS) -> None:
    pending = set(SERVICES)
    deadline = time.monotonic() + START_TIMEOUT_S
    while pending:
        assert not stack.dead(), f"died at start: {stack.dead()}: {_tails(stack)}"
        assert time.monotonic() < deadline, f"not healthy after {START_TIMEOUT_S}s: {pending}"
        for name in sorted(pending):
            if await healthy(nc, name) is not None:
                pending.discard(name)
        await asyncio.sleep(0.2)


async def stop(procs: Mapping[str, asyncio.subprocess.Process], grace_s: float = 15.0) -> None:
    for proc in procs.values():
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
    for proc in procs.values():
        try:
            await asyncio.wait_for(proc.wait(), grace_s)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()


def _tails(stack: Stack) -> str:
    return "\n".join(f"--- {n}\n{stack.log_tail(n)}" for n in stack.dead())


@pytest.fixture
async def stack(tmp_path: Path, tiny_model: Path) -> AsyncIterator[Stack]:
    monitor_port = free_port()
    server = NatsServer(
        NatsServerSettings(
            store_dir=tmp_path / "nats",
            port=RANDOM_PORT,
            monitor_port=monitor_port,
            max_payload=MAX_PAYLOAD,
        )
    )
    await server.start_async()
    logs = tmp_path / "logs"
    logs.mkdir()
    # AF_UNIX paths are short: the sandbox's sockets stay out of pytest's long tmp paths.
    sockets = Path(tempfile.mkdtemp(prefix="tfz-"))
    procs: dict[str, asyncio.subprocess.Process] = {}
    try:
        for name in SERVICES:
            env = service_env(name, server.url, tmp_path, sockets, tiny_model)
            procs[name] = await spawn(name, env, logs)
        yield Stack(server.url, f"http://127.0.0.1:{monitor_port}", procs, logs)
    finally:
        await stop(procs)
        await asyncio.to_thread(server.stop)
        shutil.rmtree(sockets, ignore_errors=True)


# ---------------------------------------------------------------- sending


@dataclass
class Replies:
    """What came back to the requests and probes, by trace id."""

    by_trace: dict[str, Message] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)


async def send(url: str, nc: NATS, bads: list[Bad]) -> Replies:
    replies = Replies()
    durable = [b for b in bads if b.target.kind == "stream"]
    core = [b for b in bads if b.target.kind in ("request", "probe")]
    events = [b for b in bads if b.target.kind == "event"]
    async with asyncio.TaskGroup() as group:
        group.create_task(publish_durably(url, durable))
        group.create_task(request_all(nc, core, replies))
        for bad in events:
            await nc.publish(bad.target.subject, bad.data, headers={h.TRACE_ID: bad.trace})
        await nc.flush()
    return replies


async def publish_durably(url: str, bads: list[Bad]) -> None:
    """Into the streams, pipelined; each must be stored (a refusal would be a test bug)."""
    bus = await Bus.connect(ConnectOptions(url=url, name="fuzz-publisher", retry_forever=False))
    try:
        for start in range(0, len(bads), PUBLISH_CHUNK):
            chunk = bads[start : start + PUBLISH_CHUNK]
            items = [Publication(b.target.subject, b.data, stream_headers(b.trace)) for b in chunk]
            acks = await bus.publish_many(items, timeout_s=30)
            refused = [
                (b.trace, a) for b, a in zip(chunk, acks, strict=True) if isinstance(a, Exception)
            ]
            assert not refused, refused[:5]
    finally:
        await bus.close()


async def request_all(nc: NATS, bads: list[Bad], replies: Replies) -> None:
    slots = asyncio.Semaphore(REQUESTS_AT_ONCE)

    async def one(bad: Bad) -> None:
        async with slots:
            try:
                msg = await nc.request(
                    bad.target.subject, bad.data, REQUEST_TIMEOUT_S, headers={h.TRACE_ID: bad.trace}
                )
            except Exception as error:  # no answer at all is what the test looks for
                replies.failures.append(f"{bad.trace} {bad.target.subject}: {error!r}")
                return
            replies.by_trace[bad.trace] = ANY.decode(msg.data)

    async with asyncio.TaskGroup() as group:
        for bad in bads:
            group.create_task(one(bad))


# ---------------------------------------------------------------- reading back


async def read_all(nc: NATS, spec: streams.StreamSpec, count: int) -> list[Msg]:
    """The first ``count`` messages of a stream, waiting for them as long as they keep
    coming: a loaded machine dead-letters slower, never stops, so the wait ends STALL_S
    after the last one came (and SETTLE_TIMEOUT_S at most, for the first)."""
    sub = await nc.jetstream().subscribe(spec.subjects[0], ordered_consumer=True)
    out: list[Msg] = []
    try:
        out.append(await sub.next_msg(timeout=SETTLE_TIMEOUT_S))
        while len(out) < count:
            out.append(await sub.next_msg(timeout=STALL_S))
    except TimeoutError:
        raise AssertionError(f"{spec.name}: {len(out)} of {count}, none for {STALL_S}s") from None
    finally:
        await sub.unsubscribe()
    return out


async def nothing_pending(nc: NATS, consumed: Consumed) -> dict[str, int]:
    """Messages still pending or unacked per stream consumer, once they drain, or once
    draining stalls: a loaded machine drains slower, never stops draining, so the wait
    lasts while the count goes down and ends STALL_S after it last did."""
    best, stalled_at = None, time.monotonic() + STALL_S
    while True:
        left = await _pending(nc, consumed)
        total = sum(left.values())
        if best is None or total < best:
            best, stalled_at = total, time.monotonic() + STALL_S
        if not left or time.monotonic() > stalled_at:
            return left
        await asyncio.sleep(0.2)


#: How long the pending count may stay put before the drain counts as stuck.
STALL_S = 10.0


async def _pending(nc: NATS, consumed: Consumed) -> dict[str, int]:
    jsm = nc.jsm()
    left: dict[str, int] = {}
    for stream, known in consumed.streams.items():
        # Durables made since discovery (a domain's first task) count as well.
        names = known | {c.name or "" for c in await jsm.consumers_info(stream)}
        for name in names:
            info = await jsm.consumer_info(stream, name)
            pending = (info.num_pending or 0) + (info.num_ack_pending or 0)
            if pending:
                left[f"{stream}/{name}"] = pending
    return left


# ---------------------------------------------------------------- checks


def letter_problems(bad: Bad, letter: Msg) -> list[str]:
    """What is wrong with one dead letter of ``bad``."""
    assert bad.code is not None
    hdrs = letter.headers or {}
    wrong = []
    if hdrs.get(h.DLQ_CODE) != bad.code.value:
        wrong.append(f"code {hdrs.get(h.DLQ_CODE)} != {bad.code.value}")
    if bad.field is not None and hdrs.get(h.DLQ_FIELD) != bad.field:
        wrong.append(f"field {hdrs.get(h.DLQ_FIELD)} != {bad.field}")
    if not hdrs.get(h.DLQ_REASON) or hdrs.get(h.DLQ_SUBJECT) != bad.target.subject:
        wrong.append(f"reason/subject headers {hdrs}")
    cut = hdrs.get(h.DLQ_TRUNCATED)
    if cut is None and letter.data != bad.data:
        wrong.append(f"original bytes differ ({len(letter.data)} vs {len(bad.data)})")
    # Only an original at the size limit may be cut, to make room for the headers.
    if cut is not None and not (
        bad.at_limit and cut == str(len(bad.data)) and bad.data.startswith(letter.data)
    ):
        wrong.append(f"cut to {len(letter.data)} of {len(bad.data)} bytes (said {cut})")
    return [f"{bad.trace} {bad.mutation} on {bad.target.key}: {w}" for w in wrong]


def event_problems(bad: Bad, event: ErrorEvent) -> list[str]:
    wrong = []
    if event.code is not bad.code or (bad.field is not None and event.field != bad.field):
        wrong.append(f"event {event.code}/{event.field} != {bad.code}/{bad.field}")
    if event.original_size != len(bad.data) or not bad.data.startswith(event.original):
        wrong.append("event does not hold the original")
    return [f"{bad.trace} {bad.mutation} on {bad.target.key}: {w}" for w in wrong]


def reply_problems(bad: Bad, reply: Message | None) -> list[str]:
    where = f"{bad.trace} {bad.mutation} on {bad.target.key}"
    if bad.code is None:
        return [] if isinstance(reply, Heartbeat) else [f"{where}: a probe got {reply!r}"]
    if not isinstance(reply, ErrorReply):
        return [f"{where}: got {type(reply).__name__}, not an ErrorReply"]
    if reply.code is not bad.code or (bad.field is not None and reply.field != bad.field):
        return [f"{where}: reply {reply.code}/{reply.field} != {bad.code}/{bad.field}"]
    return []


def by_trace(msgs: list[Msg]) -> dict[str, list[Msg]]:
    out: dict[str, list[Msg]] = defaultdict(list)
    for msg in msgs:
        out[(msg.headers or {}).get(h.TRACE_ID, "")].append(msg)
    return out


def stored_problems(
    bads: list[Bad], consumed: Consumed, letters: list[Msg], events: list[Msg]
) -> list[str]:
    """Every bad message dead-lettered and reported once per receiver, and nothing else."""
    letters_of, events_of = by_trace(letters), by_trace(events)
    problems = []
    for bad in bads:
        if bad.code is None or not bad.dead_lettered:
            continue
        sources = consumed.receivers(bad.target)
        mine = letters_of.pop(bad.trace, [])
        where = sorted(letter.subject for letter in mine)
        if where != sorted(subjects.dead_letter(source) for source in sources):
            problems.append(f"{bad.trace} on {bad.target.key}: dead letters on {where}")
        reported = [EVENTS.decode(e.data) for e in events_of.pop(bad.trace, [])]
        if len(reported) != len(sources):
            problems.append(f"{bad.trace} on {bad.target.key}: {len(reported)} error events")
        for letter in mine:
            problems += letter_problems(bad, letter)
        for event in reported:
            problems += event_problems(bad, event)
    extra = sorted(set(letters_of) | set(events_of))
    return problems + (
        [f"dead letters or events of no fuzz message: {extra[:10]}"] if extra else []
    )


#: Consumed on the stack as it is at least: if discovery misses one of these, it is broken.
MINIMUM = {
    *(streams.task_stream_name(t) for t in range(len(streams.TASK_STREAMS))),
    streams.ROLLOUTS.name,
    streams.SCORED.name,
    subjects.sandbox_exec(),
    subjects.sandbox_session(),
    subjects.sandbox_instance("fuzz-sandbox"),
    subjects.replay_sample(),
    subjects.status(),
    subjects.domains(),
    subjects.domain_control(),
    subjects.policy_update(),
    subjects.heartbeats(),
    subjects.ping(),
}


async def test_malformed_messages_on_every_consumed_subject_crash_nothing(stack: Stack) -> None:
    async with client(stack.url) as nc:
        await wait_healthy(stack, nc)
        consumed = await discover(nc, stack.monitor)
        known = table("fuzz-sandbox")
        unfuzzed = consumed.keys() - {t.key for t in known} - observed(known)
        assert not unfuzzed, f"consumed, but not in the fuzz table: {sorted(unfuzzed)}"
        chosen = [t for t in known if t.key in consumed.keys()]
        assert MINIMUM <= {t.key for t in chosen}, MINIMUM - {t.key for t in chosen}
        bads = corpus(Fuzzer(random.Random(SEED)), chosen)
        assert len(bads) >= 10_000

        started = time.monotonic()
        replies = await send(stack.url, nc, bads)
        sent_s = time.monotonic() - started
        stored = [b for b in bads if b.code is not None and b.dead_lettered]
        count = sum(len(consumed.receivers(b.target)) for b in stored)
        letters = await read_all(nc, streams.DEAD_LETTERS, count)
        events = await read_all(nc, streams.ERRORS, count)
        print(
            f"{len(bads)} sent in {sent_s:.1f}s, all stored after {time.monotonic() - started:.1f}s"
        )

        assert not replies.failures, replies.failures[:10]
        problems = stored_problems(bads, consumed, letters, events)
        for bad in bads:
            if bad.target.kind in ("request", "probe"):
                problems += reply_problems(bad, replies.by_trace.get(bad.trace))
        assert not problems, f"{len(problems)} problems, first: {problems[:10]}"
        assert await nothing_pending(nc, consumed) == {}
        for spec in (streams.DEAD_LETTERS, streams.ERRORS):
            info = await nc.jsm().stream_info(spec.name)
            assert info.state.messages == count, f"{spec.name}: {info.state.messages} != {count}"
        assert not stack.dead(), f"died: {stack.dead()}\n{_tails(stack)}"
        for name in SERVICES:
            assert await healthy(nc, name) is not None, f"{name} does not answer healthy"
    assert stack.failures() == [], "the runtime logged failures handling input"
