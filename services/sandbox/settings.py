"""Sandbox service settings: defaults a request gets, maxima no request may exceed."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Literal

from protocol.messages import SandboxLimits
from services.runtime.settings import RuntimeSettings, SettingsError

BackendName = Literal["auto", "docker", "bwrap", "subprocess"]
#: Where an operator raises a maximum (``TEMPER_SANDBOX_MAXIMA_<FIELD>``).
MAXIMA_VARIABLE = "TEMPER_SANDBOX_MAXIMA_{field}"


@dataclass(frozen=True, kw_only=True)
class Limits:
    """Resolved limits of one execution (every field set)."""

    timeout_s: float = 10.0
    memory_mb: int = 512
    pids: int = 128
    cpus: float = 1.0
    output_bytes: int = 1024 * 1024
    disk_mb: int = 64


def language_defaults() -> dict[str, SandboxLimits]:
    """Compilers, node and openscad need more memory and processes than a Python run."""
    return {
        "c": SandboxLimits(memory_mb=1024, pids=256),
        "cpp": SandboxLimits(memory_mb=2048, pids=256),
        "js": SandboxLimits(memory_mb=1024, pids=256),
        # CGAL's boolean operations are slow and hungry.
        "openscad": SandboxLimits(timeout_s=60.0, memory_mb=2048, pids=256),
    }


@dataclass(frozen=True, kw_only=True)
class SandboxSettings:
    runtime: RuntimeSettings = field(default_factory=RuntimeSettings)
    #: ``docker``; ``bwrap`` (bubblewrap, no Docker needed); ``subprocess`` (weak isolation);
    #: ``auto``: docker when the engine answers and has the image, else bwrap, else subprocess.
    backend: BackendName = "auto"
    image: str = "temper-sandbox:latest"
    #: Warm containers kept ready.
    pool_size: int = 4
    #: Container creations at once (each costs a core for a moment).
    max_creates: int = 2
    #: Recycle a sandbox after this many uses (reset in between).  Runs never see each
    #: other (reset, and each run a clean spare of the agent's zygote), so this bounds
    #: only slow drift; a replacement costs the CPU of dozens of runs.
    max_uses: int = 1000
    #: Per-container socket directories live here (bind-mounted into the containers).
    state_dir: Path = Path("/tmp/temper-sandbox")
    snapshot_dir: Path = Path("/tmp/temper-sandbox/snapshots")
    #: Snapshots older than this are removed (generators take one per turn boundary of a
    #: multi-turn sample; a resume or retry needs it for as long as its task may wait).
    snapshot_ttl_s: float = 86400.0
    defaults: Limits = field(default_factory=Limits)
    maxima: Limits = field(
        default_factory=lambda: Limits(
            timeout_s=120.0,
            memory_mb=4096,
            pids=1024,
            cpus=2.0,
            output_bytes=16 << 20,
            disk_mb=1024,
        )
    )
    languages: tuple[str, ...] = ("python", "bash", "sh", "c", "cpp", "js", "openscad")
    #: Per language, what it changes in ``defaults``.  A request's own limits (a domain's
    #: ``sandbox`` table) win over these; a request above ``maxima`` is refused, and so is
    #: a start where these or ``defaults`` exceed ``maxima`` (:meth:`check`).
    language_defaults: Mapping[str, SandboxLimits] = field(default_factory=language_defaults)
    max_code_bytes: int = 1 << 20
    #: How long a request may wait for a free sandbox before an ``unavailable`` error.
    acquire_timeout_s: float = 30.0
    #: Outer watchdog: kill the sandbox if the agent has not answered this long after the timeout.
    watchdog_grace_s: float = 3.0
    #: Ping idle sandboxes this often and replace dead ones (0: never).
    health_interval_s: float = 5.0
    session_ttl_s: float = 300.0
    max_sessions: int = 64
    #: Concurrent executions served by one instance.
    max_in_flight: int = 16
    #: Container user; must match the image (deploy/sandbox).
    user: str = "10001"
    #: The user of checker sessions (``SandboxOpen.checker``): a uid no candidate's code
    #: runs as, so nothing a candidate left can be its own at check time.
    checker_user: str = "10002"
    #: Fresh checker sandboxes kept warm, once the first is asked for (each is used once).
    checker_pool_size: int = 2
    nofile: int = 256
    #: Docker engine URL; empty uses the local socket (or DOCKER_HOST).
    docker_url: str = ""

    def defaults_for(self, language: str) -> Limits:
        """``defaults`` with ``language``'s own laid over them, within ``maxima``."""
        own = self.language_defaults.get(language)
        if own is None:
            return self.defaults
        chosen = {}
        for spec in fields(Limits):
            value = getattr(own, spec.name)
            if value is not None:
                chosen[spec.name] = min(value, getattr(self.maxima, spec.name))
        return replace(self.defaults, **chosen)

    def over_maxima(self, limits: SandboxLimits) -> list[str]:
        """Each field of ``limits`` above its maximum, said as a sentence naming the
        variable that raises it; empty when the service would accept them."""
        over = []
        for spec in fields(Limits):
            value, ceiling = getattr(limits, spec.name), getattr(self.maxima, spec.name)
            if value is not None and value > ceiling:
                variable = MAXIMA_VARIABLE.format(field=spec.name.upper())
                over.append(f"{spec.name} {value:g} is above the maximum {ceiling:g} ({variable})")
        return over

    def check(self) -> None:
        """Refuse, at start, settings under which requests would be refused one by one:
        a default or a language's default above the maxima."""
        wrong = [f"defaults: {why}" for why in self.over_maxima(_as_request(self.defaults))]
        for language, own in sorted(self.language_defaults.items()):
            wrong += [f"language {language!r}: {why}" for why in self.over_maxima(own)]
        if wrong:
            raise SettingsError("sandbox limits above their maxima: " + "; ".join(wrong))
        if self.checker_user == self.user:
            raise SettingsError(
                f"sandbox checker_user {self.checker_user!r} is the code's user: checks must "
                "run as a uid no candidate's code runs as (TEMPER_SANDBOX_CHECKER_USER)"
            )


def _as_request(limits: Limits) -> SandboxLimits:
    return SandboxLimits(**{spec.name: getattr(limits, spec.name) for spec in fields(Limits)})
