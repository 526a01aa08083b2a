"""The sandbox service: SandboxExec by request/reply, and sessions for multi-step tasks.

One-off execs arrive on ``temper.v1.sandbox.exec`` (queue group: any instance).
A session is opened on ``temper.v1.sandbox.session``; its later requests go to
the subject of the instance holding its sandbox.  A session's lease is renewed by
every use and reclaimed when it runs out.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import time
import uuid
from collections.abc import Coroutine
from dataclasses import dataclass, field, replace
from typing import Any

from protocol import subjects
from protocol.codec import Codec
from protocol.errors import ErrorCode
from protocol.messages import (
    Message,
    SandboxClose,
    SandboxExec,
    SandboxOpen,
    SandboxResult,
    SandboxSession,
    SandboxSnapshot,
    SandboxSnapshotRequest,
    SandboxStatus,
)
from services.runtime.errors import RequestRejected
from services.runtime.responder import Request
from services.runtime.service import Service
from services.sandbox.agent_client import AgentError, AgentRejected, ExecRequest
from services.sandbox.backend import Backend, Box, Outcome, SandboxUnavailable
from services.sandbox.images import ImageRefused, TaskImage
from services.sandbox.limits import resolve
from services.sandbox.requests import check_exec, check_path
from services.sandbox.settings import BackendName, Limits, SandboxSettings
from services.sandbox.snapshots import SnapshotStore


@dataclass(eq=False)
class Session:
    id: str
    box: Box
    limits: Limits
    language: str
    ttl_s: float
    expires_at: float
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def renew(self) -> None:
        self.expires_at = time.time() + self.ttl_s


def make_backend(settings: SandboxSettings, name: BackendName | None = None) -> Backend:
    name = name or settings.backend
    if name == "docker":
        from services.sandbox.docker_backend import DockerBackend

        return DockerBackend(settings)
    if name == "bwrap" or name == "subprocess":
        from services.sandbox.local_backend import LocalBackend

        return LocalBackend(replace(settings, backend=name))
    raise ValueError(f"unknown sandbox backend {name!r} (auto, docker, bwrap, subprocess)")


async def detect_backend(settings: SandboxSettings) -> BackendName:
    """``auto``: Docker when the engine answers and has the image, else bubblewrap, else bare."""
    from services.sandbox.docker_backend import docker_ready

    if await docker_ready(settings):
        return "docker"
    return "bwrap" if shutil.which("bwrap") else "subprocess"


class SandboxService(Service):
    name = "sandbox"

    def __init__(self, settings: SandboxSettings, backend: Backend | None = None) -> None:
        settings.check()  # a misconfigured limit stops the start, not every request
        super().__init__(settings.runtime)
        self.settings = settings
        self._backend = backend
        self.subject = subjects.sandbox_instance(re.sub(r"[^A-Za-z0-9_-]", "-", self.instance))
        self._sessions: dict[str, Session] = {}
        self.snapshots = SnapshotStore(settings.snapshot_dir, settings.snapshot_ttl_s)
        #: Used sandboxes being reset (or replaced), each on its own: one slow removal
        #: must not hold back the resets that free the others.
        self._releasing: set[asyncio.Task[None]] = set()
        self.executed = 0

    @property
    def backend(self) -> Backend:
        if self._backend is None:
            raise RuntimeError("the sandbox backend is chosen at start")
        return self._backend

    async def setup(self) -> None:
        if self._backend is None:
            name = self.settings.backend
            if name == "auto":
                name = await detect_backend(self.settings)
            self._backend = make_backend(self.settings, name)
        self.log.info("sandbox_backend", backend=self.backend.name)
        await self.backend.start()
        limit = self.settings.max_in_flight
        self.respond(
            subjects.sandbox_exec(), Codec(SandboxExec), self._on_exec, max_in_flight=limit
        )
        self.respond(subjects.sandbox_session(), Codec(SandboxOpen), self._on_open)
        self.listen(
            self.subject,
            Codec(SandboxExec | SandboxSnapshotRequest | SandboxClose),
            self._on_instance,
        )

    def background(self) -> list[Coroutine[Any, Any, None]]:
        return [self.backend.maintain(), self._expire_loop()]

    async def teardown(self) -> None:
        for session in list(self._sessions.values()):
            self._end(session)
        await asyncio.gather(*self._releasing, return_exceptions=True)
        await self.backend.close()

    def statistics(self) -> dict[str, float]:
        values = super().statistics()
        values.update(self.backend.statistics())
        values["sessions"] = float(len(self._sessions))
        # Generators hold tool-using tasks until a session is free
        # (services/generator/scheduling/sandbox_admission.py).
        values["sessions_free"] = float(max(0, self.settings.max_sessions - len(self._sessions)))
        values["executed"] = float(self.executed)
        return values

    # ---------------------------------------------------------------- one-off execs

    async def _on_exec(self, request: SandboxExec, _: Request) -> Message:
        if request.session is not None:
            return await self._session_exec(request)
        defaults = self.settings.defaults_for(request.language)
        limits = resolve(request.limits, defaults, self.settings.maxima)
        exec_request = self._exec_request(request, limits, request.language)
        try:
            box = await self.backend.acquire(limits)
        except SandboxUnavailable as error:
            return _infra(request, str(error))
        try:
            outcome = await self.backend.execute(box, exec_request, limits, last=True)
        finally:
            self._release_later(box)
        return self._result(request, outcome)

    def _exec_request(self, request: SandboxExec, limits: Limits, language: str) -> ExecRequest:
        check_exec(request, language, self.settings)
        return ExecRequest(
            id=request.id,
            language=language if request.code is not None else None,
            code=request.code,
            argv=list(request.command) if request.command is not None else None,
            stdin=request.stdin,
            files=dict(request.files),
            timeout_s=limits.timeout_s,
            output_bytes=limits.output_bytes,
            env={},
            outputs=tuple(request.outputs),
        )

    def _result(self, request: SandboxExec, outcome: Outcome) -> SandboxResult:
        self.executed += 1
        reply = outcome.reply
        return SandboxResult(
            id=request.id,
            status=outcome.status,
            session=request.session,
            exit_code=reply.exit_code,
            stdout=reply.stdout.decode("utf-8", "replace"),
            stderr=reply.stderr.decode("utf-8", "replace"),
            stdout_truncated=reply.stdout_truncated,
            stderr_truncated=reply.stderr_truncated,
            duration_s=reply.duration_s,
            error=outcome.error,
            outputs=dict(reply.outputs),
        )

    def _release_later(self, box: Box) -> None:
        """Reset (or replace) a used sandbox while the reply goes out, off the request's path."""
        task = asyncio.get_running_loop().create_task(self._release(box))
        self._releasing.add(task)
        task.add_done_callback(self._releasing.discard)

    async def _release(self, box: Box) -> None:
        # This task was made before the reply was sent, so it would run first: the reply
        # goes out, then the cgroup reads and the reset.
        await asyncio.sleep(0)
        try:
            await self.backend.release(box)
        except Exception as error:  # one bad container must not stop the pool
            self.log.error("release_failed", error=repr(error))

    # ---------------------------------------------------------------- sessions

    async def _on_open(self, request: SandboxOpen, _: Request) -> Message:
        if len(self._sessions) >= self.settings.max_sessions:
            raise RequestRejected(
                ErrorCode.UNAVAILABLE,
                f"this instance holds {len(self._sessions)} sessions (the maximum)",
            )
        archive = await self.snapshots.load(request.snapshot) if request.snapshot else None
        defaults = self.settings.defaults_for(request.language)
        limits = resolve(request.limits, defaults, self.settings.maxima)
        for path in request.files:
            check_path(path)
        image = await self._task_image(request.image)
        try:
            box = await self.backend.acquire(limits, checker=request.checker, image=image)
        except SandboxUnavailable as error:
            raise RequestRejected(ErrorCode.UNAVAILABLE, str(error)) from None
        if archive is None and image is not None and image.seed:
            archive = image.seed  # the image's own work-directory files, under the tmpfs
        ttl = request.ttl_s or self.settings.session_ttl_s
        session = Session(uuid.uuid4().hex, box, limits, request.language, ttl, time.time() + ttl)
        self._sessions[session.id] = session
        try:
            if archive is not None:
                await box.agent.extract(archive, timeout_s=limits.timeout_s)
            if request.files:
                await self._write_files(session, request.files)
        except AgentError as error:
            self._end(session)
            raise RequestRejected(
                ErrorCode.UNAVAILABLE, f"cannot prepare the session: {error}"
            ) from None
        return self._describe(session, "open", request.snapshot)

    async def _task_image(self, name: str | None) -> TaskImage | None:
        """None for the configured image; else the task image checked, or the request
        refused naming it."""
        if name is None or name == self.settings.image:
            return None
        try:
            return await self.backend.task_image(name)
        except ImageRefused as error:
            raise RequestRejected(ErrorCode.BAD_REQUEST, str(error), field="$.image") from None
        except SandboxUnavailable as error:
            raise RequestRejected(ErrorCode.UNAVAILABLE, str(error)) from None

    async def _write_files(self, session: Session, files: dict[str, bytes]) -> None:
        setup = ExecRequest(
            id=f"{session.id}-files",
            language=None,
            code=None,
            argv=["true"],
            stdin=b"",
            files=files,
            timeout_s=session.limits.timeout_s,
            output_bytes=1024,
            env={},
        )
        await self.backend.execute(session.box, setup, session.limits)

    async def _on_instance(self, request: Message, ctx: Request) -> Message:
        if isinstance(request, SandboxExec):
            return await self._session_exec(request)
        if isinstance(request, SandboxClose):
            session = self._session(request.session)
            self._end(session)
            return self._describe(session, "closed")
        assert isinstance(request, SandboxSnapshotRequest)
        return await self._snapshot(self._session(request.session))

    async def _snapshot(self, session: Session) -> SandboxSnapshot:
        async with session.lock:
            session.renew()
            try:
                data = await session.box.agent.archive(timeout_s=session.limits.timeout_s)
            except AgentRejected as error:
                # What code left cannot be archived (too big): the workspace's state,
                # a bad request, not the service failing.
                raise RequestRejected(
                    ErrorCode.BAD_REQUEST, f"the work directory cannot be archived: {error.error}"
                ) from None
            except AgentError as error:
                raise RequestRejected(ErrorCode.UNAVAILABLE, f"cannot archive: {error}") from None
        return await self.snapshots.save(session.id, data)

    async def _session_exec(self, request: SandboxExec) -> Message:
        session = self._session(request.session or "")
        async with session.lock:
            session.renew()
            exec_request = self._exec_request(request, session.limits, request.language)
            outcome = await self.backend.execute(session.box, exec_request, session.limits)
        if session.box.spoiled is not None:
            self._end(session)  # its sandbox is gone; the caller restores from a snapshot
        return self._result(request, outcome)

    def _session(self, session_id: str) -> Session:
        session = self._sessions.get(session_id)
        if session is None or session.expires_at < time.time():
            raise RequestRejected(
                ErrorCode.BAD_REQUEST,
                f"unknown or expired session {session_id!r} on this instance",
                field="$.session",
            )
        return session

    def _describe(
        self, session: Session, state: str, snapshot: str | None = None
    ) -> SandboxSession:
        return SandboxSession(
            session=session.id,
            subject=self.subject,
            state=state,  # type: ignore[arg-type]
            expires_at=session.expires_at,
            snapshot=snapshot,
        )

    def _end(self, session: Session) -> None:
        if self._sessions.pop(session.id, None) is not None:
            self._release_later(session.box)

    async def _expire_loop(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            now = time.time()
            for session in [
                s for s in self._sessions.values() if s.expires_at < now and not s.lock.locked()
            ]:
                self.log.info("session_expired", session=session.id)
                self._end(session)


def _infra(request: SandboxExec, error: str) -> SandboxResult:
    return SandboxResult(
        id=request.id, status=SandboxStatus.INFRA_ERROR, session=request.session, error=error
    )
