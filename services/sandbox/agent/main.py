"""Start-up: options, hardening, the zygote, then serving until SIGTERM."""

from __future__ import annotations

import gc
import os
import signal
import socket
import sys
import types

from .child import run_environment
from .common import Terminated, log
from .libc import PR_SET_CHILD_SUBREAPER, PR_SET_DUMPABLE, prctl
from .options import parse_options
from .processes import kill_strays, reap_children
from .protocol import VERSION
from .seccomp import install_seccomp_filter
from .server import Agent
from .zygote import ZYGOTE_FD, ZYGOTE_FLAG, Zygote, zygote_main


def _on_signal(signum: int, _frame: types.FrameType | None) -> None:
    raise Terminated(signum)


def harden() -> None:
    """Keep code (same uid) out of the agent and its helpers (see the seccomp module)."""
    if not prctl(PR_SET_DUMPABLE, 0):  # no ptrace, no /proc/<agent>/mem for code
        log("cannot make the agent non-dumpable (no libc?)")
    # Spares are orphaned to the agent (see the zygote): as PID 1 it is their reaper
    # anyway; elsewhere (the local backends) it must ask to be.
    if not prctl(PR_SET_CHILD_SUBREAPER, 1) and os.getpid() != 1:
        log("cannot become a subreaper: runs will not start")
    why_not = install_seccomp_filter()
    if why_not is not None:
        log(f"no seccomp filter of our own ({why_not}); helpers stay non-dumpable")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == [ZYGOTE_FLAG]:  # a replacement zygote, exec-ed by the agent
        zygote_main(socket.socket(fileno=ZYGOTE_FD), int(args[1]), int(args[2]))
    opts = parse_options(args)
    if opts.container and 1 not in (os.getpid(), os.getppid()):
        # --container kills every process it can see: only where PID 1 is ours.
        log("refusing --container: the agent is neither PID 1 nor its child (not a container?)")
        return 2
    # Runs get a fresh environment each; the agent's own is a run's without the request's.
    os.environ.clear()
    os.environ.update(run_environment(opts.workdir))
    harden()
    zygote = Zygote(opts.run_nice)
    zygote.start(fresh=False)  # forked before any request is read: nothing to leak
    zygote.ask()
    agent = Agent(opts, zygote)
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    agent.watch_children()
    try:
        agent.listen()
        log(f"listening on {opts.socket_path} (workdir {opts.workdir}, v{VERSION})")
        gc.freeze()  # the agent's long-lived objects leave the GC's generations
        agent.serve_forever()
    except Terminated:
        pass
    finally:
        agent.close()
        if opts.container:
            kill_strays()
        reap_children()
    return 0
