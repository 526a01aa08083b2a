"""The agent's command line."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

from .languages import Language, parse_languages
from .limits import DEFAULT_FSIZE_BYTES, DEFAULT_NOFILE, Limits


@dataclass(frozen=True, slots=True)
class Options:
    socket_path: str
    workdir: str
    container: bool
    languages: dict[str, Language]
    limits: Limits
    socket_mode: int
    #: Nice value of the zygote, and so of spares and runs (see "the zygote").
    run_nice: int


def parse_options(argv: list[str] | None = None) -> Options:
    p = argparse.ArgumentParser(description="Temper sandbox agent")
    p.add_argument("--socket", required=True, help="unix socket path to listen on")
    p.add_argument("--workdir", required=True, help="working directory of executions")
    p.add_argument("--container", action="store_true", help="own the PID namespace")
    p.add_argument("--languages", help="JSON object merged over the language table")
    p.add_argument("--nofile", type=int, default=DEFAULT_NOFILE)
    p.add_argument("--fsize-bytes", type=int, default=DEFAULT_FSIZE_BYTES)
    memory = p.add_mutually_exclusive_group()
    memory.add_argument("--memory-bytes", type=int, help="RLIMIT_AS of each execution")
    memory.add_argument("--memory-mb", type=int, help="the same in MiB")
    p.add_argument("--nproc", type=int, help="RLIMIT_NPROC (refused with --container)")
    p.add_argument("--socket-mode", type=lambda s: int(s, 8), help="octal, e.g. 600")
    p.add_argument(
        "--run-nice",
        type=int,
        choices=range(20),
        metavar="0-19",
        help="nice value of runs: 19 with --container (the default), 0 without",
    )
    a = p.parse_args(argv)
    if a.container and a.nproc is not None:
        p.error("--nproc is per uid across the whole host: not with --container")
    try:
        languages = parse_languages(a.languages)
    except ValueError as exc:
        p.error(str(exc))
    socket_dir = os.path.dirname(os.path.abspath(a.socket))
    workdir = os.path.abspath(a.workdir)
    if os.path.commonpath([socket_dir, workdir]) == workdir:
        p.error("the socket must not live inside the workdir (reset empties it)")
    mode = a.socket_mode if a.socket_mode is not None else (0o666 if a.container else 0o600)
    memory_bytes = a.memory_mb * 1024 * 1024 if a.memory_mb is not None else a.memory_bytes
    limits = Limits(a.nofile, a.fsize_bytes, memory_bytes, a.nproc)
    run_nice = a.run_nice if a.run_nice is not None else (19 if a.container else 0)
    socket_path = os.path.abspath(a.socket)
    return Options(socket_path, workdir, a.container, languages, limits, mode, run_nice)
