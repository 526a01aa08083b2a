"""Run a real SGLang server as a child process (tests, benchmarks, ``temper up`` on one host).

The server runs from its own venv (``deploy/sglang-cpu/build.sh``), never from Temper's:
SGLang pins its own torch and transformers.  It listens on loopback only, in its own
session so a terminal's Ctrl-C reaches the supervisor first, and dies with its parent.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Final, Self

import aiohttp

from services.runtime.ports import free_port
from services.runtime.procs import child_preexec, terminate

REPO: Final = Path(__file__).resolve().parents[3]
DEPLOY_DIR: Final = REPO / "deploy" / "sglang-cpu"
DEFAULT_CACHE: Final = Path("/var/cache/temper")
#: Written by build.sh after a successful build: the python of the newest complete venv.
POINTER_NAME: Final = "sglang-cpu.current"
STAMP_NAME: Final = ".temper-build-complete"

#: Environment of every server this module starts.  SGLANG_RETURN_ORIGINAL_LOGPROB makes
#: SGLang return the raw model log-softmax of each sampled token (its default scales the
#: logits by the temperature first), which is what the learner's importance ratio needs.
#: The hub variables stop a mistyped weight path from becoming a download attempt.
SERVER_ENV: Final = {
    "SGLANG_USE_CPU_ENGINE": "1",
    "SGLANG_RETURN_ORIGINAL_LOGPROB": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}


class SGLangServerError(RuntimeError):
    """The SGLang server could not be found, started, or did not become ready."""


def venv_hash(deploy_dir: Path = DEPLOY_DIR) -> str:
    """The 16-hex-digit key of the venv build.sh makes from ``deploy_dir`` (same recipe)."""
    shims = sorted(
        str(path.relative_to(deploy_dir))
        for path in (deploy_dir / "shims").rglob("*.py")
        if path.is_file()
    )
    digest = hashlib.sha256()
    for name in ["requirements.txt", "build.sh", *shims]:
        digest.update(name.encode() + b"\n")
        digest.update((deploy_dir / name).read_bytes())
    return digest.hexdigest()[:16]


def cache_dir(environ: Mapping[str, str]) -> Path:
    return Path(environ.get("TEMPER_CACHE") or DEFAULT_CACHE)


def sglang_python(environ: Mapping[str, str]) -> Path | None:
    """The python of a built SGLang venv, or ``None`` when there is none.

    ``TEMPER_SGLANG_PYTHON`` wins (and must exist); else the venv build.sh makes from this
    checkout's inputs; else the newest build any checkout published (the pointer file).
    """
    explicit = environ.get("TEMPER_SGLANG_PYTHON")
    if explicit:
        path = Path(explicit)
        if not os.access(path, os.X_OK):
            raise SGLangServerError(f"TEMPER_SGLANG_PYTHON={explicit} is not an executable")
        return path
    cache = cache_dir(environ)
    if (DEPLOY_DIR / "build.sh").is_file():
        venv = cache / f"sglang-cpu-{venv_hash()}"
        if (venv / STAMP_NAME).is_file():
            return venv / "bin" / "python"
    with contextlib.suppress(OSError):
        pointed = Path((cache / POINTER_NAME).read_text().strip())
        if (pointed.parents[1] / STAMP_NAME).is_file():
            return pointed
    return None


@dataclass(frozen=True, kw_only=True)
class SGLangServerSettings:
    model_path: Path
    python: Path
    host: str = "127.0.0.1"
    #: 0 picks a free port.
    port: int = 0
    #: float32 on CPUs without native bf16 (faster there, and logprobs comparable to fp32).
    dtype: str = "float32"
    max_total_tokens: int = 8192
    mem_fraction_static: float = 0.1
    attention_backend: str = "torch_native"
    device: str = "cpu"
    #: Without it an idle scheduler polls in a loop and holds a whole core busy.
    sleep_on_idle: bool = True
    #: Directory for the server log; a temporary one when ``None``.
    log_dir: Path | None = None
    ready_timeout_s: float = 180.0
    stop_grace_s: float = 15.0
    extra_args: tuple[str, ...] = ()
    extra_env: Mapping[str, str] = field(default_factory=dict)


class SGLangServer:
    """One ``sglang.launch_server`` process.  ``await start()`` returns once it serves."""

    def __init__(self, settings: SGLangServerSettings) -> None:
        self.settings = settings
        self._proc: subprocess.Popen[bytes] | None = None
        self._port: int | None = None
        self._log_path: Path | None = None

    @property
    def url(self) -> str:
        if self._port is None:
            raise SGLangServerError("the SGLang server has not started")
        return f"http://{self.settings.host}:{self._port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def log_path(self) -> Path | None:
        return self._log_path

    def command(self, port: int) -> list[str]:
        s = self.settings
        return [
            str(s.python), "-m", "sglang.launch_server",
            "--model-path", str(s.model_path),
            "--device", s.device,
            "--attention-backend", s.attention_backend,
            "--disable-cuda-graph",
            "--dtype", s.dtype,
            "--max-total-tokens", str(s.max_total_tokens),
            "--mem-fraction-static", str(s.mem_fraction_static),
            "--host", s.host,
            "--port", str(port),
            *(["--sleep-on-idle"] if s.sleep_on_idle else []),
            *s.extra_args,
        ]  # fmt: skip

    async def start(self) -> str:
        """Launch and wait until a generation succeeds; returns the URL."""
        if self.running:
            return self.url
        self._port = self.settings.port or free_port(self.settings.host)
        self._launch(self._port)
        try:
            await self._wait_ready()
        except BaseException:
            self.terminate()
            raise
        return self.url

    def _launch(self, port: int) -> None:
        log_dir = self.settings.log_dir or Path(tempfile.mkdtemp(prefix="temper-sglang-"))
        log_dir.mkdir(parents=True, exist_ok=True)
        self._log_path = log_dir / f"sglang-{port}.log"
        env = {**os.environ, **SERVER_ENV, **self.settings.extra_env}
        with self._log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                self.command(port),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                # Its own session (and process group): stop() can end the scheduler and
                # detokenizer children it forks, and a terminal's Ctrl-C skips it.
                start_new_session=True,
                preexec_fn=child_preexec(),
            )

    async def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.settings.ready_timeout_s
        async with aiohttp.ClientSession() as http:
            while time.monotonic() < deadline:
                code = self._proc.poll() if self._proc else -1
                if code is not None:
                    raise SGLangServerError(
                        f"SGLang server exited with {code} while starting:\n{self.log_tail()}"
                    )
                if await _answers(http, f"{self.url}/health_generate"):
                    return
                await asyncio.sleep(0.5)
        raise SGLangServerError(
            f"SGLang server not ready after {self.settings.ready_timeout_s:.0f}s:\n"
            f"{self.log_tail()}"
        )

    def log_tail(self, lines: int = 40) -> str:
        if self._log_path is None or not self._log_path.exists():
            return "(no log)"
        text = self._log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:]) + f"\n(full log: {self._log_path})"

    def terminate(self) -> None:
        """SIGTERM by pid, SIGKILL after the grace period, then its process group (blocking)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        terminate(proc, self.settings.stop_grace_s)
        # SGLang's scheduler and detokenizer are its children in the group it leads; a
        # SIGKILLed parent cannot reap them, so end whatever is left of that group.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)

    async def wait(self) -> int:
        """Until the server exits by itself; its exit code."""
        proc = self._proc
        if proc is None:
            raise SGLangServerError("the SGLang server has not started")
        return await asyncio.to_thread(proc.wait)

    async def stop(self) -> None:
        await asyncio.to_thread(self.terminate)

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()


async def _answers(http: aiohttp.ClientSession, url: str) -> bool:
    try:
        async with http.get(url, timeout=aiohttp.ClientTimeout(total=10)) as response:
            return response.status == 200
    except (aiohttp.ClientError, TimeoutError):
        return False


def main(argv: list[str] | None = None) -> int:
    """``python -m services.engines.sglang.server --model DIR``: serve until Ctrl-C."""
    import argparse

    parser = argparse.ArgumentParser(description="Run a CPU SGLang server for Temper.")
    parser.add_argument("--model", type=Path, required=True, help="Hugging Face model directory")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args(argv)
    python = sglang_python(os.environ)
    if python is None:
        parser.error("no SGLang venv: run deploy/sglang-cpu/build.sh (or set TEMPER_SGLANG_PYTHON)")
    settings = SGLangServerSettings(
        model_path=args.model.resolve(), python=python, port=args.port, dtype=args.dtype
    )
    try:
        return asyncio.run(_serve(SGLangServer(settings)))
    except KeyboardInterrupt:  # the server was stopped on the way out (async with)
        return 130


async def _serve(server: SGLangServer) -> int:
    async with server:
        print(f"SGLang serving at {server.url} (log: {server.log_path}); Ctrl-C stops it")
        code = await server.wait()
    print(f"SGLang server exited with {code}:\n{server.log_tail()}")
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
