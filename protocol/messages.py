"""Version 1 message types.

Every message is a MessagePack map.  Two keys are always present:

* ``type``: the tag that names the message (``"task"``, ``"rollout"``, ...)
* ``v``: the protocol major version (``1``)

Evolution inside a major version is additive: new fields get defaults, readers
ignore keys they do not know, a field never changes type.  Binary fields
(``bytes``) hold packed little-endian arrays, see :mod:`protocol.packed`.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Final, Literal

import msgspec
import numpy as np
import numpy.typing as npt
from msgspec import Meta

from protocol.errors import ErrorCode
from protocol.packed import F32, I32, unpack_f32, unpack_i32, unpack_u8

PROTOCOL_VERSION: Final = 1
#: Priority tiers: 0 is served first.  One task stream per tier.
TIERS: Final = 4
DEFAULT_TIER: Final = 1

#: Ids and domains are used as subject tokens, so they are restricted to a safe alphabet.
Token = Annotated[str, Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9_\-]{0,127}\Z")]
#: A token or empty: a task's tenant, empty for the default tenant.
OptionalToken = Annotated[str, Meta(pattern=r"^(?:[A-Za-z0-9][A-Za-z0-9_\-]{0,127})?\Z")]
Tier = Annotated[int, Meta(ge=0, lt=TIERS)]
NonNegInt = Annotated[int, Meta(ge=0)]
PositiveInt = Annotated[int, Meta(ge=1)]
NonNegFloat = Annotated[float, Meta(ge=0)]


class Message(msgspec.Struct, tag_field="type", kw_only=True, omit_defaults=False):
    """Base of every v1 message: carries the protocol major version."""

    v: int = PROTOCOL_VERSION


class Record(msgspec.Struct, kw_only=True):
    """Base of nested (untagged) records."""


def _require_items(field: str, data: bytes, itemsize: int) -> int:
    if len(data) % itemsize:
        raise ValueError(f"`{field}` holds {len(data)} bytes, not a multiple of {itemsize}")
    return len(data) // itemsize


# --------------------------------------------------------------------------- tasks


class ChatMessage(Record):
    role: Literal["system", "user", "assistant", "tool"]
    content: str
    name: str | None = None


class SamplingParams(Record):
    temperature: NonNegFloat = 1.0
    top_p: Annotated[float, Meta(gt=0, le=1)] = 1.0
    #: -1 disables top-k.
    top_k: Annotated[int, Meta(ge=-1)] = -1
    max_tokens: PositiveInt = 256
    stop: list[str] = []
    stop_token_ids: list[int] = []
    seed: int | None = None


class GatewayCall(Record):
    """Marks a task as one interactive call of the gateway (docs/gateway.md): its samples
    go back to the caller, not to the rollout stream, and nothing of it is retried."""

    #: The core subject the ``CallResult`` goes to (``subjects.gateway_reply``).
    reply: str
    #: The trajectory the call continues or starts: the engine's routing key, so a
    #: server that holds the trajectory's earlier turns in its prefix cache serves it.
    route: str = ""
    #: Trajectories the call starts (the rest continue one): what the staleness
    #: admission counts, since each trajectory becomes one trained rollout.
    new_samples: NonNegInt = 0


class Task(Message, tag="task"):
    """A unit of work: one prompt, sampled ``n`` times (a GRPO group)."""

    id: Token
    domain: Token
    tier: Tier = DEFAULT_TIER
    #: Either chat messages (rendered by the model's chat template) ...
    prompt: list[ChatMessage] = []
    #: ... or prompt token ids, packed ``<i4``.  Exactly one of the two is set.
    prompt_tokens: bytes = b""
    tools: list[str] = []
    sampling: SamplingParams = msgspec.field(default_factory=SamplingParams)
    n: Annotated[int, Meta(ge=1, le=4096)] = 1
    max_turns: PositiveInt = 1
    max_total_tokens: PositiveInt | None = None
    #: Unix time (seconds) after which the task is no longer worth doing.
    deadline: float | None = None
    #: 0 for the first try; a retry of failed samples counts up (their ids include it).
    attempt: NonNegInt = 0
    created_at: float | None = None
    #: Free-form, domain-specific data (reference answers, unit tests, ...).
    metadata: dict[str, Any] = {}
    #: The sample indices to generate, each below ``n`` (a retry of part of a group);
    #: empty: all ``n``.
    samples: list[NonNegInt] = []
    #: Unix time (seconds) before which the task is not started (a retry's backoff).
    not_before: float | None = None
    #: Samples suspended by a preemption: each goes on from its saved state; the other
    #: ``samples`` start afresh.
    resume: list[SavedTrajectory] = []
    #: How often this attempt was preempted (its re-queued message ids count them).
    preemptions: NonNegInt = 0
    #: Who submitted it, for fair share between the tenants of a domain; empty: the
    #: default tenant.  Part of the subject, which must agree with it.
    tenant: OptionalToken = ""
    #: Set for a gateway call: its samples are answered on ``call.reply``.
    call: GatewayCall | None = None

    def __post_init__(self) -> None:
        _require_items("prompt_tokens", self.prompt_tokens, I32.itemsize)
        if bool(self.prompt) == bool(self.prompt_tokens):
            raise ValueError("exactly one of `prompt` and `prompt_tokens` must be set")
        if any(index >= self.n for index in self.samples):
            raise ValueError(f"`samples` {self.samples} names an index not below n={self.n}")
        if len(set(self.samples)) != len(self.samples):
            raise ValueError(f"`samples` {self.samples} names an index twice")
        resumed = [saved.sample_index for saved in self.resume]
        if len(set(resumed)) != len(resumed) or not set(resumed) <= set(self.sample_indices):
            raise ValueError(f"`resume` samples {resumed} must be distinct and in `samples`")

    @property
    def sample_indices(self) -> list[int]:
        """The samples this task generates."""
        return list(self.samples) if self.samples else list(range(self.n))


# --------------------------------------------------------------------------- rollouts


class FinishReason(StrEnum):
    STOP = "stop"
    LENGTH = "length"
    MAX_TURNS = "max_turns"
    DEADLINE = "deadline"
    ABORT = "abort"
    ERROR = "error"


class RolloutStatus(StrEnum):
    OK = "ok"
    INVALID = "invalid"
    INFRA_FAILURE = "infra_failure"


class FailureKind(StrEnum):
    """What failed in an ``infra_failure`` rollout: retries and quarantine go by it."""

    #: The tool machinery (the sandbox service, a sandbox).
    TOOL = "tool"
    #: The inference engine.
    ENGINE = "engine"
    #: A turn ran past its time limit.
    TIMEOUT = "timeout"


class Segment(Record):
    """A run of completion tokens ``[start, end)`` produced by one source."""

    start: NonNegInt
    end: NonNegInt
    kind: Literal["gen", "tool"] = "gen"
    #: Policy version that generated the segment; ``None`` for tool output.
    version: int | None = None
    #: The inference server that generated it (its URL); empty for tool output and for an
    #: embedded engine.  Every turn of a task names one server when routing is sticky.
    server: str = ""
    #: Prompt tokens of this turn served from that server's prefix cache.
    cached_tokens: NonNegInt = 0


class ToolCall(Record):
    turn: NonNegInt
    name: str
    arguments: str
    output: str = ""
    status: str = "ok"
    duration_s: NonNegFloat = 0.0


class Timings(Record):
    queued_s: NonNegFloat = 0.0
    generate_s: NonNegFloat = 0.0
    tool_s: NonNegFloat = 0.0
    total_s: NonNegFloat = 0.0


class SavedTrajectory(Record):
    """A sample suspended at a turn boundary (preempted), to go on where it stopped.

    ``completion`` (packed ``<i4``), ``logprobs`` (``<f4``) and ``loss_mask`` (``u8``)
    hold one entry per completion token so far, as in a Rollout.
    """

    sample_index: NonNegInt
    completion: bytes = b""
    logprobs: bytes = b""
    loss_mask: bytes = b""
    segments: list[Segment] = []
    tool_calls: list[ToolCall] = []
    turns: NonNegInt = 0
    cached_tokens: NonNegInt = 0
    generate_s: NonNegFloat = 0.0
    tool_s: NonNegFloat = 0.0
    #: The sandbox snapshot of its tool session's work directory; None: no session yet.
    snapshot: str | None = None

    def __post_init__(self) -> None:
        total = _require_items("completion", self.completion, I32.itemsize)
        n_logprobs = _require_items("logprobs", self.logprobs, F32.itemsize)
        if n_logprobs != total or len(self.loss_mask) != total:
            raise ValueError(
                f"`logprobs` ({n_logprobs}) and `loss_mask` ({len(self.loss_mask)}) "
                f"must each have one entry per completion token ({total})"
            )


class Rollout(Message, tag="rollout"):
    """One sampled trajectory for a task, with what the learner needs to correct for staleness.

    ``tokens`` is the whole sequence (prompt then completion, packed ``<i4``).
    ``logprobs`` and ``loss_mask`` cover the completion only: one entry per token
    from ``prompt_len`` on.  Tool output tokens have mask 0 and logprob 0.
    """

    id: str
    task: Task
    sample_index: NonNegInt
    tokens: bytes = b""
    prompt_len: NonNegInt = 0
    logprobs: bytes = b""
    loss_mask: bytes = b""
    segments: list[Segment] = []
    tool_calls: list[ToolCall] = []
    completion_text: str = ""
    finish_reason: FinishReason = FinishReason.STOP
    status: RolloutStatus = RolloutStatus.OK
    error: str | None = None
    timings: Timings = msgspec.field(default_factory=Timings)
    cached_prompt_tokens: NonNegInt = 0
    engine: str = ""
    generator: str = ""
    created_at: float | None = None
    #: Set with ``status == infra_failure``: what failed.
    failure: FailureKind | None = None
    #: The sandbox snapshot of its tool session as the sample left it (a terminal task is
    #: judged from it, not from a replay); ``None`` when it opened no session.
    snapshot: str | None = None
    #: Why that end snapshot could not be taken (a work directory that cannot be
    #: archived, e.g. too big): the rollout is judged on that state, not replayed.
    snapshot_error: str | None = None

    def __post_init__(self) -> None:
        total = _require_items("tokens", self.tokens, I32.itemsize)
        n_logprobs = _require_items("logprobs", self.logprobs, F32.itemsize)
        if self.prompt_len > total:
            raise ValueError(f"`prompt_len` {self.prompt_len} exceeds {total} tokens")
        completion = total - self.prompt_len
        if n_logprobs != completion or len(self.loss_mask) != completion:
            raise ValueError(
                f"`logprobs` ({n_logprobs}) and `loss_mask` ({len(self.loss_mask)}) "
                f"must each have one entry per completion token ({completion})"
            )

    @property
    def token_ids(self) -> npt.NDArray[np.int32]:
        return unpack_i32(self.tokens)

    @property
    def completion_ids(self) -> npt.NDArray[np.int32]:
        return unpack_i32(self.tokens)[self.prompt_len :]

    @property
    def behaviour_logprobs(self) -> npt.NDArray[np.float32]:
        return unpack_f32(self.logprobs)

    @property
    def mask(self) -> npt.NDArray[np.uint8]:
        return unpack_u8(self.loss_mask)

    @property
    def policy_version(self) -> int | None:
        """Oldest policy version in the completion: staleness is measured from it."""
        versions = [s.version for s in self.segments if s.version is not None]
        return min(versions) if versions else None


def rollout_id(task_id: str, sample_index: int, attempt: int = 0) -> str:
    """Stable rollout id: the same sample of the same attempt of a task always gets the
    same id (a redelivery is deduplicated), and each retry a new one."""
    if attempt:
        return f"{task_id}/{sample_index}@{attempt}"
    return f"{task_id}/{sample_index}"


class CallResult(Message, tag="call_result"):
    """A gateway call's samples, sent by the generator to the call's ``reply`` subject
    instead of the rollout stream: one rollout per sample, in sample order."""

    task_id: str
    rollouts: list[Rollout] = []


class CallCancel(Message, tag="call_cancel"):
    """The gateway gave up on a call (its client went away): the generator serving it
    stops, frees its slot and answers nothing; one that has not started it drops it."""

    task_id: str
    #: Unix time after which the cancel no longer matters: the call's own deadline, past
    #: which every generator refuses it anyway.
    until: float


# --------------------------------------------------------------------------- sandbox


class SandboxStatus(StrEnum):
    OK = "ok"
    NONZERO_EXIT = "nonzero_exit"
    TIMEOUT = "timeout"
    OOM = "oom"
    OUTPUT_LIMIT = "output_limit"
    KILLED = "killed"
    INFRA_ERROR = "infra_error"


class SandboxLimits(Record):
    """Per-execution limits; ``None`` takes the service's default (always capped by its maxima)."""

    timeout_s: Annotated[float, Meta(gt=0)] | None = None
    memory_mb: PositiveInt | None = None
    pids: PositiveInt | None = None
    cpus: Annotated[float, Meta(gt=0)] | None = None
    output_bytes: PositiveInt | None = None
    disk_mb: PositiveInt | None = None


class SandboxExec(Message, tag="sandbox_exec"):
    id: str
    #: Run inside an open session (multi-step tasks); ``None`` for a one-off.
    session: str | None = None
    language: str = "python"
    #: Source to run, or ``command`` (argv) to execute; exactly one is set.
    code: str | None = None
    command: list[str] | None = None
    stdin: bytes = b""
    #: Files written into the work directory before running: relative path -> content.
    files: dict[str, bytes] = {}
    limits: SandboxLimits = msgspec.field(default_factory=SandboxLimits)
    #: Work-directory files to send back once the run is over (e.g. the ``out.stl`` of
    #: an ``openscad`` run), within ``limits.output_bytes`` together.
    outputs: list[str] = []

    def __post_init__(self) -> None:
        if (self.code is None) == (self.command is None):
            raise ValueError("exactly one of `code` and `command` must be set")


class SandboxResult(Message, tag="sandbox_result"):
    id: str
    status: SandboxStatus
    session: str | None = None
    exit_code: int | None = None
    stdout: str = ""
    stderr: str = ""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    duration_s: NonNegFloat = 0.0
    error: str | None = None
    #: The requested outputs that the run left as regular files and that fit; a missing
    #: one is absent.
    outputs: dict[str, bytes] = {}


class SandboxOpen(Message, tag="sandbox_open"):
    """Open a session: one sandbox kept for a multi-step task until closed or its lease ends."""

    id: str
    language: str = "python"
    limits: SandboxLimits = msgspec.field(default_factory=SandboxLimits)
    #: Lease: the session is reclaimed this long after its last use; ``None`` takes the default.
    ttl_s: Annotated[float, Meta(gt=0)] | None = None
    files: dict[str, bytes] = {}
    #: Start from this snapshot's work directory (retry or resume a multi-step task).
    snapshot: str | None = None
    #: A checker's session: a fresh sandbox of the service's checker user, a uid no
    #: candidate's code runs as, in which no candidate's code ran before; never reused.
    checker: bool = False
    #: Run the session in this image instead of the service's own: a Harbor task's
    #: image (one carrying the Temper Harbor label); ``None``: the configured image.
    image: str | None = None


class SandboxSession(Message, tag="sandbox_session"):
    """Reply to SandboxOpen and SandboxClose."""

    session: str
    #: Send this session's SandboxExec, SandboxSnapshotRequest and SandboxClose here:
    #: the subject of the one instance that holds the sandbox.
    subject: str
    state: Literal["open", "closed"] = "open"
    expires_at: float = 0.0
    snapshot: str | None = None


class SandboxClose(Message, tag="sandbox_close"):
    session: str


class SandboxSnapshotRequest(Message, tag="sandbox_snapshot_request"):
    """Archive the session's work directory durably; restore it later with SandboxOpen."""

    session: str


class SandboxSnapshot(Message, tag="sandbox_snapshot"):
    snapshot: str
    session: str
    size: NonNegInt = 0
    #: ``sha256:<hex>`` of the archive.
    digest: str = ""
    created_at: float = 0.0


# --------------------------------------------------------------------------- scoring


class ScoreStatus(StrEnum):
    SCORED = "scored"
    INFRA_FAILURE = "infra_failure"
    INVALID = "invalid"


class ValidatorDetail(Record):
    name: str
    score: float
    weight: float = 1.0
    status: ScoreStatus = ScoreStatus.SCORED
    message: str = ""
    #: A PNG picture of what was judged (a CAD validator's render), or ``None``.  Only
    #: some rollouts carry one (held-out ones by default): it is small, not free.
    preview: bytes | None = None
    #: The score the validator gave when it was outside the validator's declared range:
    #: ``score`` is then that value clamped into the range (and an error event says so).
    clamped_from: float | None = None


class ScoredRollout(Message, tag="scored_rollout"):
    """A rollout with its reward.  Only ``status == scored`` enters advantage statistics."""

    id: str
    rollout: Rollout
    reward: float = 0.0
    status: ScoreStatus = ScoreStatus.SCORED
    details: list[ValidatorDetail] = []
    error: str | None = None
    validator: str = ""
    scored_at: float | None = None


# --------------------------------------------------------------------------- replay


class BatchStatus(StrEnum):
    OK = "ok"
    PARTIAL = "partial"
    EMPTY = "empty"


class SampleRequest(Message, tag="sample_request"):
    id: str
    learner_version: NonNegInt
    max_samples: PositiveInt
    #: Drop samples older than this many policy versions; ``None`` takes the buffer's setting.
    max_staleness: NonNegInt | None = None
    #: Mixing weights by domain; empty means proportional to what is stored.
    domain_weights: dict[str, NonNegFloat] = {}
    #: Only hand out complete GRPO groups.
    whole_groups: bool = True
    #: How long the buffer may wait to fill the batch.
    wait_s: NonNegFloat = 0.0
    #: Serve nothing unless this many samples are ready within ``wait_s``: a batch too
    #: small to train on stays in the buffer instead of being handed out and lost.
    min_samples: NonNegInt = 0
    #: Hold the served rollouts as leased until a BatchCommit names them (exactly-once
    #: training); False acks them as they are served.
    lease: bool = False


class Batch(Message, tag="batch"):
    request_id: str
    items: list[ScoredRollout] = []
    status: BatchStatus = BatchStatus.OK
    dropped_stale: NonNegInt = 0
    #: Members that left untrained with their group while serving this request (infra
    #: failures, invalid): like stale drops, started samples that will never be trained.
    excluded: NonNegInt = 0
    remaining: NonNegInt = 0
    #: Trace id of each served rollout (by rollout id), for the learner's ledger.
    traces: dict[str, str] = {}


class BatchCommit(Message, tag="batch_commit"):
    """Rollouts whose training step is durable: the buffer acks them for good.

    Idempotent: ids the buffer no longer holds are counted as unknown, not refused.
    """

    id: str
    rollout_ids: list[str]
    #: The learner instance and the step through which these rollouts were trained.
    learner: str = ""
    through_step: NonNegInt = 0


class LeaseRelease(Message, tag="lease_release"):
    """A learner (re)started: every leased rollout it did not commit goes back to the buffer."""

    id: str
    learner: str = ""


class CommitReply(Message, tag="commit_reply"):
    request_id: str
    #: Rollouts acked by this commit; ids no longer held (already committed, or
    #: redelivered and not seen yet) count as unknown.
    committed: NonNegInt = 0
    unknown: NonNegInt = 0
    #: Leased rollouts handed back to the buffer by a LeaseRelease.
    released: NonNegInt = 0


# --------------------------------------------------------------------------- weights


class WeightFormat(StrEnum):
    HF_SAFETENSORS = "hf_safetensors"
    TORCH_DISTRIBUTED = "torch_distributed"


class PolicyUpdate(Message, tag="policy_update"):
    version: NonNegInt
    #: Where the weights are (a Hugging Face directory on a shared volume, or a rendezvous URI).
    uri: str
    #: ``sha256:<hex>`` over the weight files, checked before loading.
    digest: str
    format: WeightFormat = WeightFormat.HF_SAFETENSORS
    step: NonNegInt = 0
    created_at: float | None = None
    metadata: dict[str, Any] = {}
    #: Samples the learner has consumed so far (trained on, or judged to carry no signal);
    #: generators pace their admission by it.  Announced again, with the same version,
    #: after batches that changed no weight.
    trained_samples: NonNegInt = 0
    #: ``trained_samples`` plus the samples the replay buffer let go untrained on their way
    #: to this learner (stale, or excluded with their group): everything started that will
    #: never be trained.  Generators pace their admission by it: counting only what was
    #: trained, every drop would stay "ahead" for good and shrink the budget until nothing
    #: starts.
    settled_samples: NonNegInt = 0
    #: With ``TORCH_DISTRIBUTED``: the same weights as a Hugging Face directory (digest
    #: ``digest``), for engines that cannot receive a broadcast; empty when there is none.
    path: str = ""


class WeightTensor(Record):
    """One tensor of a broadcast, in broadcast order."""

    name: str
    #: torch dtype without the ``torch.`` prefix (``float32``, ``bfloat16``, ...).
    dtype: str
    shape: list[NonNegInt]


class WeightGroupOpen(Message, tag="weight_group_open"):
    """A generator asks the learner to host a process group for its inference servers."""

    #: The generator instance; a new request replaces the group it held before.
    instance: str
    #: Servers that join as ranks 1..servers (the learner is rank 0).
    servers: PositiveInt


class WeightGroup(Message, tag="weight_group"):
    """Where the servers join the learner's process group (a TCP rendezvous)."""

    group: str
    master_address: str
    master_port: Annotated[int, Meta(ge=1, le=65535)]
    world_size: Annotated[int, Meta(ge=2)]
    backend: str = "gloo"


class WeightSend(Message, tag="weight_send"):
    """A generator asks for ``version`` over ``group``; its servers receive it at once."""

    group: str
    version: NonNegInt


class WeightSending(Message, tag="weight_sending"):
    """The learner broadcasts these tensors over ``group`` now, in this order."""

    group: str
    #: The version sent: the one asked for, or a newer one already announced.
    version: NonNegInt
    #: The digest of the version's published directory (the announcement's).
    digest: str
    tensors: list[WeightTensor]


class WeightSyncAck(Message, tag="weight_sync_ack"):
    version: NonNegInt
    service: str
    instance: str
    ok: bool
    error: str | None = None
    duration_s: NonNegFloat = 0.0


# --------------------------------------------------------------------------- control


class ServiceState(StrEnum):
    STARTING = "starting"
    RUNNING = "running"
    DRAINING = "draining"
    STOPPED = "stopped"


class Heartbeat(Message, tag="heartbeat"):
    service: str
    instance: str
    state: ServiceState
    healthy: bool
    pid: int = 0
    host: str = ""
    started_at: float = 0.0
    sent_at: float = 0.0
    in_flight: NonNegInt = 0
    detail: str = ""
    #: The policy version the instance serves (generators); None for services without one.
    policy_version: NonNegInt | None = None
    #: Its Prometheus endpoint, ``http://<host>:<port>/metrics``; empty when it serves none.
    metrics_url: str = ""


class Stats(Message, tag="stats"):
    service: str
    instance: str
    sent_at: float = 0.0
    values: dict[str, float] = {}


class StatusRequest(Message, tag="status_request"):
    """Ask the control service for the view of the whole stack."""


class ServiceStatus(Record):
    service: str
    instance: str
    state: ServiceState
    healthy: bool
    age_s: NonNegFloat
    in_flight: NonNegInt = 0
    detail: str = ""
    #: Silent for longer than the control service's bound: most likely dead (killed, host
    #: lost). ``state`` and ``healthy`` are then what its last heartbeat said.
    gone: bool = False
    #: From its heartbeat: the policy version it serves (generators), else None.
    policy_version: NonNegInt | None = None
    #: Behind the newest announced policy version for longer than the control's bound.
    lagging: bool = False
    #: From its heartbeat: its Prometheus endpoint, empty when it serves none.
    metrics_url: str = ""


class StreamStatus(Record):
    name: str
    messages: NonNegInt
    bytes: NonNegInt
    consumers: NonNegInt
    pending: NonNegInt = 0


class StackStatus(Message, tag="stack_status"):
    services: list[ServiceStatus] = []
    streams: list[StreamStatus] = []
    dead_letters: NonNegInt = 0
    at: float = 0.0


# --------------------------------------------------------------------------- domains


class DomainsRequest(Message, tag="domains_request"):
    """Ask for the domains the stack serves; any validator answers (all load one registry)."""

    #: Only these domains, in this order; empty: every served domain.
    names: list[str] = []
    #: Add one example Task per domain, as the stack's own tools build them.
    examples: bool = False


class DomainValidator(Record):
    """One validator of a domain and its share of the reward."""

    kind: str
    #: ``ValidatorDetail.name`` of its scores.
    name: str
    weight: float = 1.0
    params: dict[str, Any] = {}


class DomainInfo(Record):
    """What a client needs to build a valid task of one domain."""

    name: Token
    #: The family or built-in kind that made the domain (``arithmetic``, ``jsonl``, ...).
    kind: str = ""
    description: str = ""
    #: The prompt: ``[system, user]`` chat messages, the user's text being ``prompt_template``
    #: with ``{question}`` replaced; no system message when ``prompt_system`` is empty.
    prompt_system: str = ""
    prompt_template: str = "{question}"
    #: Keys of ``Task.metadata`` the validators read; a task lacking one is scored ``invalid``.
    metadata_keys: list[str] = []
    validators: list[DomainValidator] = []
    tools: list[str] = []
    tier: Tier = DEFAULT_TIER
    #: Group size (``Task.n``) of the domain's own tasks.
    samples: PositiveInt = 1
    max_tokens: PositiveInt = 256
    max_turns: PositiveInt = 1
    #: A scored rollout passes when its reward reaches this.
    pass_threshold: float = 1.0
    #: ``keep`` or ``filter``: what training does with a sample cut at the token limit.
    overlong: str = "keep"
    sandbox: SandboxLimits | None = None
    #: Share of the domain's problems held out for evaluation (``metadata.split == "eval"``).
    eval_fraction: NonNegFloat = 0.0
    #: Distinct held-out problems an evaluation uses (at most 500); ``None``: not counted yet.
    eval_size: NonNegInt | None = None
    #: A valid task of the domain, when the request asked for examples.
    example: Task | None = None


class DomainList(Message, tag="domain_list"):
    """Reply to DomainsRequest."""

    domains: list[DomainInfo] = []
    #: Validator instance that answered.
    validator: str = ""


class DomainControl(Message, tag="domain_control"):
    """Ask every generator to change how it schedules one domain (``temper domain``);
    an empty ``domain`` with nothing to change only asks for the schedules."""

    domain: str = ""
    #: Lift the domain's quarantine now.
    resume: bool = False
    #: The domain's new weight in the fair share of its tier, until the generator restarts
    #: (the domain config's ``share_weight`` is the lasting one).
    share_weight: float | None = None


class TenantSchedule(Record):
    """How one generator instance schedules one tenant of a domain."""

    #: Empty: the default tenant.
    tenant: str = ""
    started: NonNegInt = 0
    in_flight: NonNegInt = 0


class DomainSchedule(Record):
    """How one generator instance schedules one domain."""

    domain: str
    #: ``active``, ``quarantined`` or ``probing`` (quarantined, its probe task running).
    state: str = "active"
    share_weight: float = 1.0
    #: Tasks this instance started since it started.
    started: NonNegInt = 0
    #: Tasks of the domain this instance is generating now.
    in_flight: NonNegInt = 0
    #: Infrastructure-failure share that quarantined it (0 when active).
    failure_rate: float = 0.0
    #: Per tenant (the default one as ``""``), once the domain had a named tenant's task;
    #: ``started`` and ``in_flight`` above count them all.
    tenants: list[TenantSchedule] = []


class DomainSchedules(Message, tag="domain_schedules"):
    """A generator instance's answer to a DomainControl."""

    instance: str
    #: The change asked for was made (a resume of a domain that was not held is not).
    applied: bool = False
    domains: list[DomainSchedule] = []


# --------------------------------------------------------------------------- errors


class ErrorEvent(Message, tag="error_event"):
    """Published when a service rejects input; ``original`` holds the rejected bytes."""

    code: ErrorCode
    message: str
    field: str | None = None
    service: str = ""
    instance: str = ""
    subject: str = ""
    trace_id: str = ""
    original: bytes = b""
    original_size: NonNegInt = 0
    #: ``original`` was cut to keep the event under the payload limit.
    truncated: bool = False
    at: float = 0.0


class ErrorReply(Message, tag="error"):
    """The answer to a request that could not be served."""

    code: ErrorCode
    message: str
    field: str | None = None


AnyMessage = (
    Task
    | Rollout
    | CallResult
    | CallCancel
    | SandboxExec
    | SandboxResult
    | SandboxOpen
    | SandboxSession
    | SandboxClose
    | SandboxSnapshotRequest
    | SandboxSnapshot
    | ScoredRollout
    | SampleRequest
    | Batch
    | BatchCommit
    | LeaseRelease
    | CommitReply
    | PolicyUpdate
    | WeightSyncAck
    | WeightGroupOpen
    | WeightGroup
    | WeightSend
    | WeightSending
    | Heartbeat
    | Stats
    | StatusRequest
    | StackStatus
    | ErrorEvent
    | ErrorReply
    | DomainsRequest
    | DomainList
    | DomainControl
    | DomainSchedules
)

#: Every tagged type of this version, by tag.
MESSAGE_TYPES: Final[dict[str, type[Message]]] = {
    t.__struct_config__.tag: t for t in AnyMessage.__args__
}


def task_id_of(message: Message) -> str | None:
    """The task a message belongs to, for logs and traces."""
    if isinstance(message, Task):
        return message.id
    if isinstance(message, Rollout):
        return message.task.id
    if isinstance(message, CallResult | CallCancel):
        return message.task_id
    if isinstance(message, ScoredRollout):
        return message.rollout.task.id
    return None
