"""SGLangEngine's HTTP side against a scripted stand-in on loopback (no SGLang needed).

The real server is exercised in tests/integration/test_sglang_engine.py; here the
stand-in injects what a real one rarely does on demand: bad JSON, 500s, a hung update,
a failed continue.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from services.engines.engine import (
    EngineError,
    GenerateRequest,
    Sampling,
    WeightUpdateError,
)
from services.engines.sglang.broadcast import TensorSpec
from services.engines.sglang.engine import (
    SGLangEngine,
    SGLangEngineSettings,
    SGLangSample,
)

Handler = Callable[[dict[str, Any]], web.StreamResponse | None]


def output(ids: list[int], **meta: Any) -> dict[str, Any]:
    """One /generate answer item, shaped like SGLang 0.5.23's."""
    info: dict[str, Any] = {
        "id": "rid",
        "finish_reason": {"type": "length", "length": len(ids)},
        "prompt_tokens": 3,
        "weight_version": "default",
        "output_token_logprobs": [[-0.5 - i, token, None] for i, token in enumerate(ids)],
        "cached_tokens": 2,
        "weight_versions": [{"version": "default", "start": 0, "end": len(ids)}],
    }
    info.update(meta)
    return {"text": "", "output_ids": ids, "meta_info": info}


@dataclass
class FakeSGLang:
    """Records every call; a path answers from ``handlers`` or with SGLang's success shape."""

    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    handlers: dict[str, Handler] = field(default_factory=dict)
    url: str = ""
    #: Set at teardown: handlers that "hang" wait for it, so the stand-in stops at once.
    released: asyncio.Event = field(default_factory=asyncio.Event)

    async def hang(self, payload: dict[str, Any]) -> None:
        await self.released.wait()

    @property
    def paths(self) -> list[str]:
        return [path for path, _ in self.calls]

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        payload = json.loads(body) if body else {}
        self.calls.append((request.path, payload))
        handler = self.handlers.get(request.path)
        if handler is not None:
            answer = handler(payload)
            if asyncio.iscoroutine(answer):
                answer = await answer
            if answer is not None:
                return answer
        return self.default(request.path, payload)

    @staticmethod
    def default(path: str, payload: dict[str, Any]) -> web.StreamResponse:
        if path == "/model_info":
            return web.json_response({"model_path": "/m", "weight_version": "default"})
        if path == "/generate":
            return web.json_response([output([7, 8, 9]) for _ in payload["input_ids"]])
        if path == "/health_generate":
            return web.Response()
        return web.json_response({"success": True, "message": "ok"})


@pytest.fixture
async def fake() -> AsyncIterator[FakeSGLang]:
    server = FakeSGLang()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", server.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    server.url = f"http://127.0.0.1:{port}"
    try:
        yield server
    finally:
        server.released.set()
        await runner.cleanup()


SETTINGS = SGLangEngineSettings(
    check_raw_logprobs=False, control_timeout_s=2, update_timeout_s=2, request_timeout_s=2
)


@pytest.fixture
async def engine(fake: FakeSGLang) -> AsyncIterator[SGLangEngine]:
    async with SGLangEngine([fake.url], SETTINGS) as started:
        yield started


async def test_generate_sends_n_rows_with_their_own_seeds_and_parses_each(
    engine: SGLangEngine, fake: FakeSGLang
) -> None:
    sampling = Sampling(temperature=0.7, top_k=20, max_new_tokens=3, seed=10, stop_token_ids=(2,))
    samples = await engine.generate(
        GenerateRequest(prompt_ids=[1, 2, 3], sampling=sampling, n=3, trajectory_id="t")
    )
    _, payload = fake.calls[-1]
    assert payload["input_ids"] == [[1, 2, 3]] * 3
    assert [p["sampling_seed"] for p in payload["sampling_params"]] == [10, 11, 12]
    assert payload["sampling_params"][0]["stop_token_ids"] == [2]
    assert payload["return_logprob"] is True and payload["logprob_start_len"] == -1
    assert len(set(payload["rid"])) == 3
    assert [s.output_ids for s in samples] == [[7, 8, 9]] * 3
    assert samples[0].logprobs == [-0.5, -1.5, -2.5]
    assert samples[0].finish == "length" and samples[0].cached_tokens == 2
    stats = engine.statistics()
    assert (stats.requests, stats.prompt_tokens, stats.cached_tokens) == (1, 9, 6)
    assert stats.generated_tokens == 9


async def test_weight_version_spans_become_policy_versions(
    engine: SGLangEngine, fake: FakeSGLang
) -> None:
    spans = [{"version": "4", "start": 0, "end": 2}, {"version": "5", "start": 2, "end": 3}]
    fake.handlers["/generate"] = lambda payload: web.json_response(
        [output([7, 8, 9], weight_versions=spans, finish_reason={"type": "stop", "matched": 9})]
    )
    [sample] = await engine.generate(GenerateRequest(prompt_ids=[1]))
    assert isinstance(sample, SGLangSample)
    assert sample.version == 4, "the oldest policy that produced any of its tokens"
    assert [(s.version, s.start, s.end) for s in sample.version_spans] == [(4, 0, 2), (5, 2, 3)]
    assert sample.finish == "stop"


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (web.Response(text="not json{"), "not JSON"),
        (web.json_response([{"output_ids": [1]}]), "unexpected answer"),
        (web.json_response([output([1, 2]), output([1, 2])]), "2 outputs for 1 prompts"),
        (web.json_response([output([1, 2], output_token_logprobs=[[-1.0, 5, None]])]), "tokens"),
        (web.json_response({"error": {"message": "bad"}}, status=400), "HTTP 400"),
    ],
)
async def test_bad_answers_raise_engine_error(
    engine: SGLangEngine, fake: FakeSGLang, answer: web.Response, message: str
) -> None:
    fake.handlers["/generate"] = lambda payload: answer
    with pytest.raises(EngineError, match=message):
        await engine.generate(GenerateRequest(prompt_ids=[1]))
    assert engine.router.servers[fake.url].healthy, "a refused request is not an outage"


async def test_server_error_marks_the_server_unhealthy(
    engine: SGLangEngine, fake: FakeSGLang
) -> None:
    fake.handlers["/generate"] = lambda payload: web.Response(status=503, text="overloaded")
    with pytest.raises(EngineError, match="HTTP 503: overloaded"):
        await engine.generate(GenerateRequest(prompt_ids=[1]))
    assert not engine.router.servers[fake.url].healthy
    del fake.handlers["/generate"]
    await engine.generate(GenerateRequest(prompt_ids=[1]))
    assert engine.router.servers[fake.url].healthy


async def test_timed_out_generation_is_aborted_on_the_server(fake: FakeSGLang) -> None:
    fake.handlers["/generate"] = fake.hang  # type: ignore[assignment]
    quick = SGLangEngineSettings(check_raw_logprobs=False, request_timeout_s=0.2)
    async with SGLangEngine([fake.url], quick) as engine:
        with pytest.raises(EngineError, match="timed out"):
            await engine.generate(GenerateRequest(prompt_ids=[1], n=2))
    [(_, generate)] = [call for call in fake.calls if call[0] == "/generate"]
    aborted = [payload["rid"] for path, payload in fake.calls if path == "/abort_request"]
    assert aborted == generate["rid"]


async def test_cancelled_generation_is_aborted_on_the_server(fake: FakeSGLang) -> None:
    """A gateway call whose client went away: the server stops its rows."""
    fake.handlers["/generate"] = fake.hang  # type: ignore[assignment]
    async with SGLangEngine([fake.url], SGLangEngineSettings(check_raw_logprobs=False)) as engine:
        generating = asyncio.create_task(engine.generate(GenerateRequest(prompt_ids=[1], n=2)))
        while not any(path == "/generate" for path, _ in fake.calls):
            await asyncio.sleep(0.01)
        generating.cancel()
        with pytest.raises(asyncio.CancelledError):
            await generating
    [(_, generate)] = [call for call in fake.calls if call[0] == "/generate"]
    aborted = [payload["rid"] for path, payload in fake.calls if path == "/abort_request"]
    assert aborted == generate["rid"]


async def test_invalid_requests_are_refused_before_sending(engine: SGLangEngine) -> None:
    with pytest.raises(EngineError, match="n must be"):
        await engine.generate(GenerateRequest(prompt_ids=[1], n=0))
    with pytest.raises(EngineError, match="empty prompt"):
        await engine.generate(GenerateRequest(prompt_ids=[]))


async def test_update_from_disk_is_pause_update_flush_continue(
    engine: SGLangEngine, fake: FakeSGLang
) -> None:
    await engine.load_weights(3, "file:///ckpt/v3")
    control = [p for p in fake.paths if p not in ("/model_info", "/generate")]
    assert control == [
        "/pause_generation",
        "/update_weights_from_disk",
        "/flush_cache",
        "/continue_generation",
    ]
    update = dict(fake.calls)["/update_weights_from_disk"]
    assert update["model_path"] == "/ckpt/v3" and update["weight_version"] == "3"
    assert dict(fake.calls)["/pause_generation"] == {"mode": "retract"}
    assert engine.statistics().version == 3
    assert engine.statistics().weight_updates == 1


@pytest.mark.parametrize(
    "failure",
    [
        web.json_response({"success": False, "message": "no such dir"}, status=400),
        web.json_response({"success": False, "message": "no such dir"}, status=200),
        web.Response(status=500, text="crashed"),
    ],
)
async def test_failed_update_raises_and_still_continues(
    engine: SGLangEngine, fake: FakeSGLang, failure: web.Response
) -> None:
    fake.handlers["/update_weights_from_disk"] = lambda payload: failure
    with pytest.raises(WeightUpdateError) as raised:
        await engine.load_weights(3, "/ckpt/v3")
    assert raised.value.version == 3
    assert fake.paths[-1] == "/continue_generation"
    assert "/flush_cache" not in fake.paths
    assert engine.statistics().version == 0


async def test_hung_update_times_out_and_continues(fake: FakeSGLang) -> None:
    fake.handlers["/update_weights_from_disk"] = fake.hang  # type: ignore[assignment]
    quick = SGLangEngineSettings(check_raw_logprobs=False, update_timeout_s=0.2)
    async with asyncio.timeout(10), SGLangEngine([fake.url], quick) as engine:
        with pytest.raises(WeightUpdateError, match="timed out"):
            await engine.load_weights(3, "/ckpt/v3")
    assert fake.paths[-1] == "/continue_generation"


async def test_failed_continue_fails_the_update(engine: SGLangEngine, fake: FakeSGLang) -> None:
    fake.handlers["/continue_generation"] = lambda payload: web.Response(status=500)
    with pytest.raises(WeightUpdateError, match="stays paused"):
        await engine.load_weights(3, "/ckpt/v3")
    assert not engine.router.servers[fake.url].healthy


async def test_relative_sources_are_refused_without_calling_the_server(
    engine: SGLangEngine, fake: FakeSGLang
) -> None:
    before = list(fake.paths)
    with pytest.raises(WeightUpdateError, match="absolute path"):
        await engine.load_weights(3, "Qwen/Qwen2-0.5B")
    assert fake.paths == before


async def test_distributed_update_runs_inside_begin_and_end(
    engine: SGLangEngine, fake: FakeSGLang
) -> None:
    specs = [TensorSpec("w", "float32", (2, 3))]
    await engine.load_weights_from_distributed(4, specs, group_name="g")
    control = [p for p in fake.paths if p not in ("/model_info", "/generate")]
    assert control == [
        "/pause_generation",
        "/begin_weight_update",
        "/update_weights_from_distributed",
        "/end_weight_update",
        "/flush_cache",
        "/continue_generation",
    ]
    update = dict(fake.calls)["/update_weights_from_distributed"]
    assert update["names"] == ["w"] and update["shapes"] == [[2, 3]]
    assert update["group_name"] == "g" and update["weight_version"] == "4"


async def test_failed_distributed_update_still_ends_the_session(
    engine: SGLangEngine, fake: FakeSGLang
) -> None:
    fake.handlers["/update_weights_from_distributed"] = lambda payload: web.json_response(
        {"success": False, "message": "Failed to receive weights"}, status=400
    )
    with pytest.raises(WeightUpdateError, match="Failed to receive weights"):
        await engine.load_weights_from_distributed(4, [TensorSpec("w", "float32", (1,))])
    assert fake.paths[-2:] == ["/end_weight_update", "/continue_generation"]


async def test_group_init_gives_each_server_its_rank(fake: FakeSGLang) -> None:
    # One stand-in under two names plays two servers.
    urls = [fake.url, fake.url.replace("127.0.0.1", "localhost")]
    async with SGLangEngine(urls, SETTINGS) as engine:
        with pytest.raises(EngineError, match="world_size 2"):
            await engine.init_weights_update_group(
                master_address="127.0.0.1", master_port=1, world_size=2
            )
        await engine.init_weights_update_group(
            master_address="127.0.0.1", master_port=1234, world_size=3, group_name="g"
        )
    inits = [payload for path, payload in fake.calls if path == "/init_weights_update_group"]
    assert sorted(p["rank_offset"] for p in inits) == [1, 2]
    assert {(p["world_size"], p["group_name"], p["backend"]) for p in inits} == {(3, "g", "gloo")}


async def test_raw_logprob_check(fake: FakeSGLang) -> None:
    """Equal logprobs of one token at two temperatures pass; different ones fail clearly."""
    seen: list[float] = []

    def generate(payload: dict[str, Any]) -> web.Response:
        temperature = payload["sampling_params"][0]["temperature"]
        seen.append(temperature)
        probed = [[[-2.0 * (1 + temperature * scaled[0]), 7, None]]]
        return web.json_response([output([7], output_token_ids_logprobs=probed)])

    fake.handlers["/generate"] = generate
    scaled = [0.0]
    async with SGLangEngine([fake.url]):
        assert seen == [0.0, 0.5, 2.0]
    scaled[0] = 1.0
    engine = SGLangEngine([fake.url])
    with pytest.raises(EngineError, match="SGLANG_RETURN_ORIGINAL_LOGPROB=1"):
        await engine.start()
    await engine.close()
