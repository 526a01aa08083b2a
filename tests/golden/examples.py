"""The expected values of the v1 golden fixtures, one fully populated message per type.

``tests/golden/v1/<tag>.msgpack`` was written once from these values by
``make_fixtures.py`` and never changes, so neither may anything here: a change
would make the fixtures disagree with their expected values.  A new message type
gets a new entry (and a new fixture); existing entries stay as they are.

Values are deterministic (no clock, no randomness).  Floats sent as packed
float32 are exact in float32, so tests can compare them without tolerance.
Optional fields are set wherever the message's state allows it; where ``None``
is the only sensible value (an ``error`` on a successful result) another
example sets it, so every field is covered with a value somewhere.
"""

from __future__ import annotations

import msgspec

from protocol import pack_f32, pack_i32, pack_u8
from protocol.errors import ErrorCode
from protocol.messages import (
    Batch,
    BatchCommit,
    BatchStatus,
    CallCancel,
    CallResult,
    ChatMessage,
    CommitReply,
    DomainControl,
    DomainInfo,
    DomainList,
    DomainSchedule,
    DomainSchedules,
    DomainsRequest,
    DomainValidator,
    ErrorEvent,
    ErrorReply,
    FinishReason,
    GatewayCall,
    Heartbeat,
    LeaseRelease,
    Message,
    PolicyUpdate,
    Rollout,
    RolloutStatus,
    SampleRequest,
    SamplingParams,
    SandboxClose,
    SandboxExec,
    SandboxLimits,
    SandboxOpen,
    SandboxResult,
    SandboxSession,
    SandboxSnapshot,
    SandboxSnapshotRequest,
    SandboxStatus,
    ScoredRollout,
    ScoreStatus,
    Segment,
    ServiceState,
    ServiceStatus,
    StackStatus,
    Stats,
    StatusRequest,
    StreamStatus,
    Task,
    Timings,
    ToolCall,
    ValidatorDetail,
    WeightFormat,
    WeightGroup,
    WeightGroupOpen,
    WeightSend,
    WeightSending,
    WeightSyncAck,
    WeightTensor,
    rollout_id,
)

#: 2026-01-01T00:00:00Z; every timestamp is an offset from it.
T0 = 1_767_225_600.0

#: Prompt token ids; 151644 (> 2**16) makes byte order visible in the packed bytes.
PROMPT_IDS = [151644, 872, 198, 3838, 374, 220, 17, 488, 220, 18, 30, 151645]
#: Completion: 6 generated tokens, 3 tool-output tokens, 3 generated tokens.
COMPLETION_IDS = [27, 14301, 29, 1350, 7, 17, 20, 198, 29, 785, 4226, 151643]
#: Behaviour logprobs (exact in float32); tool output has logprob 0 and mask 0.
COMPLETION_LOGPROBS = [
    -0.5,
    -0.125,
    -1.25,
    -0.0625,
    -2.0,
    -0.25,
    0.0,
    0.0,
    0.0,
    -0.75,
    -0.375,
    -0.03125,
]
COMPLETION_MASK = [1, 1, 1, 1, 1, 1, 0, 0, 0, 1, 1, 1]

#: A task that failed validation on the generator, as the bytes it arrived with.
BAD_TASK_BYTES = (
    b"\x86\xa4type\xa4task\xa1v\x01\xa2id\xa3t-9\xa6domain\xa4math\xa1n\xa5eight"
    b"\xa6prompt\x91\x82\xa4role\xa4user\xa7content\xa2hi"
)
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
DIGEST = "sha256:7f36bed1b74c12de0e57e2e6b8ffb18b86bb40f55e7f656b20b133a66b2b98f5"


def task() -> Task:
    """A chat-prompt task with every field set (``prompt_tokens`` must then stay empty)."""
    return Task(
        id="task-0001",
        domain="math",
        tier=0,
        prompt=[
            ChatMessage(role="system", content="Answer inside <answer></answer>.", name="rules"),
            ChatMessage(role="user", content="Combien font 2 + 3 ? Réponds vite ✓"),
        ],
        tools=["python"],
        sampling=SamplingParams(
            temperature=0.7,
            top_p=0.95,
            top_k=50,
            max_tokens=512,
            stop=["</answer>"],
            stop_token_ids=[151643, 151645],
            seed=1234,
        ),
        n=8,
        max_turns=3,
        max_total_tokens=4096,
        deadline=T0 + 3600.0,
        attempt=2,
        created_at=T0,
        metadata={
            "answer": "5",
            "difficulty": 0.25,
            "source": {"name": "arith", "row": 17},
            "tests": ["assert answer == 5"],
            "verified": True,
            "notes": None,
            "blob": b"\x00\xff",
        },
    )


def token_task() -> Task:
    """A task given as prompt token ids (the other prompt form)."""
    return Task(
        id="task-0002",
        domain="math",
        tier=2,
        prompt_tokens=pack_i32(PROMPT_IDS),
        sampling=SamplingParams(temperature=1.0, max_tokens=64, seed=7),
        n=4,
        max_turns=2,
        max_total_tokens=1024,
        deadline=T0 + 7200.0,
        attempt=0,
        created_at=T0 + 1.0,
        metadata={"answer": "5"},
    )


def rollout(sample_index: int, *, ok: bool) -> Rollout:
    return Rollout(
        id=rollout_id("task-0002", sample_index),
        task=token_task(),
        sample_index=sample_index,
        tokens=pack_i32(PROMPT_IDS + COMPLETION_IDS),
        prompt_len=len(PROMPT_IDS),
        logprobs=pack_f32(COMPLETION_LOGPROBS),
        loss_mask=pack_u8(COMPLETION_MASK),
        segments=[
            Segment(start=0, end=6, kind="gen", version=7),
            Segment(start=6, end=9, kind="tool", version=None),
            Segment(start=9, end=12, kind="gen", version=8),
        ],
        tool_calls=[
            ToolCall(
                turn=0,
                name="python",
                arguments='{"code": "print(2 + 3)"}',
                output="5\n",
                status="ok",
                duration_s=0.125,
            )
        ],
        completion_text="<tool>print(2 + 3)</tool>5\n<answer>5</answer>",
        finish_reason=FinishReason.STOP if ok else FinishReason.LENGTH,
        status=RolloutStatus.OK if ok else RolloutStatus.INVALID,
        error=None if ok else "no </answer> before max_tokens",
        timings=Timings(queued_s=0.5, generate_s=1.25, tool_s=0.125, total_s=1.875),
        cached_prompt_tokens=8,
        engine="torch",
        generator="generator-0",
        created_at=T0 + 10.0,
    )


def call_result() -> CallResult:
    """A gateway call's answer: its task carries the call, its one sample came back."""
    task = msgspec.structs.replace(
        token_task(),
        id="gw-call-0003",
        tenant="acme",
        n=1,
        call=GatewayCall(
            reply="temper.v1.gateway.reply.gateway-0.gw-call-0003",
            route="gw-5f1d3c0e9a7b4c2d8e6f1a3b5c7d9e0f/0",
            new_samples=1,
        ),
    )
    sample = msgspec.structs.replace(
        rollout(0, ok=True), id=rollout_id(task.id, 0), task=task, tool_calls=[]
    )
    return CallResult(task_id=task.id, rollouts=[sample])


def scored(sample_index: int) -> ScoredRollout:
    return ScoredRollout(
        id=rollout_id("task-0002", sample_index),
        rollout=rollout(sample_index, ok=True),
        reward=0.875,
        status=ScoreStatus.SCORED,
        details=[
            ValidatorDetail(name="exact_match", score=1.0, weight=0.75, message="5 == 5"),
            ValidatorDetail(
                name="format", score=0.5, weight=0.25, status=ScoreStatus.SCORED, message="one tag"
            ),
        ],
        error=None,
        validator="validator-1",
        scored_at=T0 + 12.0,
    )


def infra_failed(sample_index: int) -> ScoredRollout:
    return ScoredRollout(
        id=rollout_id("task-0002", sample_index),
        rollout=rollout(sample_index, ok=True),
        reward=0.0,
        status=ScoreStatus.INFRA_FAILURE,
        details=[
            ValidatorDetail(
                name="unit_tests",
                score=0.0,
                weight=1.0,
                status=ScoreStatus.INFRA_FAILURE,
                message="sandbox unavailable",
            )
        ],
        error="sandbox pool unavailable after 3 tries",
        validator="validator-1",
        scored_at=T0 + 13.0,
    )


def sandbox_exec() -> SandboxExec:
    return SandboxExec(
        id="exec-0001",
        session="sess-7",
        language="python",
        code="import sys\nprint(sys.stdin.read().upper())",
        command=None,
        stdin=b"hello\n",
        files={"data/input.txt": b"1 2 3\n", "helper.py": b"def f(x):\n    return x + 3\n"},
        limits=SandboxLimits(
            timeout_s=2.5, memory_mb=256, pids=64, cpus=0.5, output_bytes=65536, disk_mb=32
        ),
    )


def sandbox_result() -> SandboxResult:
    return SandboxResult(
        id="exec-0001",
        status=SandboxStatus.NONZERO_EXIT,
        session="sess-7",
        exit_code=1,
        stdout="HELLO\n",
        stderr="Traceback (most recent call last):\nValueError: boom\n",
        stdout_truncated=False,
        stderr_truncated=True,
        duration_s=0.375,
        error="process exited with status 1",
    )


def sandbox_sessions() -> list[Message]:
    return [
        SandboxOpen(
            id="open-0001",
            language="bash",
            limits=SandboxLimits(timeout_s=5.0, memory_mb=512),
            ttl_s=120.0,
            files={"setup.sh": b"echo ready\n"},
            snapshot="snap-0003",
        ),
        SandboxSession(
            session="sess-7",
            subject="temper.v1.sandbox.instance.sandbox-0",
            state="open",
            expires_at=T0 + 120.0,
            snapshot="snap-0003",
        ),
        SandboxClose(session="sess-7"),
        SandboxSnapshotRequest(session="sess-7"),
        SandboxSnapshot(
            snapshot="snap-0004",
            session="sess-7",
            size=10240,
            digest="sha256:" + "ab" * 32,
            created_at=T0 + 30.0,
        ),
    ]


def stack_status() -> StackStatus:
    return StackStatus(
        services=[
            ServiceStatus(
                service="generator",
                instance="generator-0",
                state=ServiceState.RUNNING,
                healthy=True,
                age_s=1.5,
                in_flight=3,
                detail="policy v13",
            ),
            ServiceStatus(
                service="sandbox",
                instance="sandbox-0",
                state=ServiceState.DRAINING,
                healthy=False,
                age_s=31.0,
                in_flight=0,
                detail="stopping",
            ),
        ],
        streams=[
            StreamStatus(name="TEMPER_TASKS_0", messages=10, bytes=20480, consumers=2, pending=4),
            StreamStatus(name="TEMPER_DLQ", messages=1, bytes=97, consumers=0, pending=0),
        ],
        dead_letters=1,
        at=T0 + 60.0,
    )


def domain_list() -> DomainList:
    """Two domains: a rule-judged one with an example task, a sandbox-judged one without."""
    arithmetic = DomainInfo(
        name="arithmetic",
        kind="arithmetic",
        description="add of 2 numbers of up to 1 digits",
        prompt_system="Compute the value of the expression. "
        "Reply with the final answer as <answer>...</answer>.",
        prompt_template="{question}=",
        metadata_keys=["answer"],
        validators=[
            DomainValidator(kind="math", name="math", weight=1.0, params={"extract": "tag"})
        ],
        tools=[],
        tier=1,
        samples=1,
        max_tokens=12,
        max_turns=1,
        pass_threshold=1.0,
        overlong="filter",
        sandbox=None,
        eval_fraction=0.2,
        eval_size=19,
        example=Task(
            id="arithmetic-train-0-0",
            domain="arithmetic",
            prompt=[
                ChatMessage(role="system", content="Compute the value of the expression."),
                ChatMessage(role="user", content="3+4="),
            ],
            sampling=SamplingParams(max_tokens=12),
            metadata={"answer": "7", "key": "arith:3+4", "split": "train", "overlong": "filter"},
        ),
    )
    functions = DomainInfo(
        name="python_functions",
        kind="python_functions",
        description="write a Python function that passes unit tests",
        prompt_system="Write the function in a ```python block.",
        prompt_template="{question}",
        metadata_keys=["tests"],
        validators=[
            DomainValidator(
                kind="code", name="unit_tests", weight=0.75, params={"timeout_s": 10.0}
            ),
            DomainValidator(kind="format", name="format", weight=0.25, params={"tags": ["python"]}),
        ],
        tools=["python"],
        tier=2,
        samples=4,
        max_tokens=384,
        max_turns=2,
        pass_threshold=0.75,
        overlong="keep",
        sandbox=SandboxLimits(timeout_s=10.0, memory_mb=256),
        eval_fraction=0.25,
        eval_size=None,
        example=None,
    )
    return DomainList(domains=[arithmetic, functions], validator="validator/validator-1")


def examples() -> dict[str, Message]:
    """One example per v1 message tag."""
    values: list[Message] = [
        task(),
        rollout(3, ok=False),
        call_result(),
        CallCancel(task_id="gw-call-0004", until=T0 + 120.0),
        sandbox_exec(),
        sandbox_result(),
        *sandbox_sessions(),
        scored(4),
        SampleRequest(
            id="req-42",
            learner_version=12,
            max_samples=64,
            max_staleness=4,
            domain_weights={"math": 0.5, "code": 0.375, "docs": 0.125},
            whole_groups=True,
            wait_s=2.5,
        ),
        Batch(
            request_id="req-42",
            items=[scored(5), infra_failed(6)],
            status=BatchStatus.PARTIAL,
            dropped_stale=3,
            remaining=120,
        ),
        BatchCommit(
            id="commit-7",
            rollout_ids=["task-1/0", "task-1/1", "task-2/0"],
            learner="learner-0",
            through_step=1300,
        ),
        LeaseRelease(id="release-1", learner="learner-0"),
        CommitReply(request_id="commit-7", committed=2, unknown=1, released=0),
        PolicyUpdate(
            version=13,
            uri="file:///shared/checkpoints/run-7/v13",
            digest=DIGEST,
            format=WeightFormat.HF_SAFETENSORS,
            step=1300,
            created_at=T0 + 30.0,
            metadata={"loss": 0.4375, "run": "run-7"},
        ),
        WeightSyncAck(
            version=13,
            service="generator",
            instance="generator-0",
            ok=False,
            error="digest mismatch",
            duration_s=1.5,
        ),
        WeightGroupOpen(instance="generator-0", servers=2),
        WeightGroup(
            group="temper-generator-0-1",
            master_address="10.0.0.7",
            master_port=29_500,
            world_size=3,
            backend="gloo",
        ),
        WeightSend(group="temper-generator-0-1", version=14),
        WeightSending(
            group="temper-generator-0-1",
            version=14,
            digest=DIGEST,
            tensors=[
                WeightTensor(name="model.embed_tokens.weight", dtype="float32", shape=[1024, 64]),
                WeightTensor(name="model.norm.weight", dtype="float32", shape=[64]),
            ],
        ),
        Heartbeat(
            service="validator",
            instance="validator-1",
            state=ServiceState.RUNNING,
            healthy=True,
            pid=4242,
            host="node-3",
            started_at=T0,
            sent_at=T0 + 5.0,
            in_flight=5,
            detail="queue 5/64",
        ),
        Stats(
            service="validator",
            instance="validator-1",
            sent_at=T0 + 5.0,
            values={"rollouts_scored": 1200.0, "reward_mean": 0.625, "latency_p50_s": 0.0625},
        ),
        StatusRequest(),
        stack_status(),
        ErrorEvent(
            code=ErrorCode.VALIDATION,
            message="invalid message: Expected `int`, got `str` (at $.n)",
            field="$.n",
            service="generator",
            instance="generator-0",
            subject="temper.v1.task.1.math",
            trace_id=TRACE_ID,
            original=BAD_TASK_BYTES,
            original_size=len(BAD_TASK_BYTES),
            truncated=False,
            at=T0 + 20.0,
        ),
        ErrorReply(
            code=ErrorCode.VALIDATION,
            message="exactly one of `code` and `command` must be set",
            field="$",
        ),
        DomainsRequest(names=["arithmetic", "python_functions"], examples=True),
        domain_list(),
        DomainControl(domain="python_functions", resume=True, share_weight=2.5),
        DomainSchedules(
            instance="generator-0",
            applied=True,
            domains=[
                DomainSchedule(
                    domain="python_functions",
                    state="quarantined",
                    share_weight=2.5,
                    started=40,
                    in_flight=0,
                    failure_rate=0.75,
                ),
                DomainSchedule(domain="arithmetic", started=120, in_flight=3),
            ],
        ),
    ]
    return {type(value).__struct_config__.tag: value for value in values}  # type: ignore[misc]
