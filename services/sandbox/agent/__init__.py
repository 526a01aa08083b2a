"""Temper sandbox agent: runs executions for the host over a unix socket.

A standard-library-only Python 3.11 package, run as ``python3 <its directory>``.  It
is the command of every sandbox container, and its PID 1 (no ``--init``: an init of
the code's uid could be traced by code and would outlive every reset; non-root, no
capabilities, read-only root, tmpfs workdir), and is also run by the local backend,
under bubblewrap (PID 1 again) or directly on the host.  It assumes a container only
when given ``--container``.  As an init it reaps every orphan as soon as it exits
(SIGCHLD) and takes SIGTERM/SIGINT as the order to stop; code cannot SIGKILL or SIGSTOP
it (the kernel drops those when sent to a PID namespace's init from inside).

    python3 agent/ --socket PATH --workdir DIR [--container] [--languages JSON]
                   [--nofile N] [--fsize-bytes N] [--memory-bytes N | --memory-mb N]
                   [--nproc N]
                   [--socket-mode OCTAL] [--run-nice 0-19]

It serves until SIGTERM (or SIGINT), then kills what it started and removes its socket.

Socket
------
The socket is bound under a temporary name with umask 0177 (mode 0600 from the start),
chmod-ed to ``--socket-mode`` and renamed onto PATH once listening, so PATH appearing
means "ready".  The default mode is 0600 on the host (the host user is the agent's
user) and 0666 with ``--container``: there the agent runs as uid 10001 while the host
connects as its own uid, so access is controlled by the host directory that is
bind-mounted at the socket's directory (the pool keeps it in a private 0700 parent).
With ``--container`` a peer that is visible in the agent's PID namespace (SO_PEERCRED
pid != 0), i.e. sandboxed code itself, is answered ``ok:false`` and disconnected: only
processes outside the container (the host) may drive the agent.
Nothing else is written outside the workdir (the socket's directory is created 0700 if
it is missing).

Where things are
----------------
``__main__``: the launcher.  ``main``: start-up, hardening, the signal handlers.
``options``, ``languages``, ``limits``: the command line, the language table, rlimits.
``protocol``: the wire protocol (framing, requests, replies; documented there).
``server``: the agent's request loop.  ``execution``: one exec, from pipes to outcome.
``zygote`` and ``forks``: where runs come from.  ``child``: a spare becoming a run.
``seccomp``: the agent's own syscall filter.  ``processes``: reaping and killing.
``files``: request files, snapshots, scratch wipes.  ``libc``: prctl through ctypes.

Execution
---------
Each exec is a child in its own session and process group, cwd = workdir, with a clean
environment (PATH, HOME=workdir, TMPDIR=workdir, LANG=C.UTF-8, then the request's env),
stdin fed from the request, RLIMIT_CORE 0, RLIMIT_NOFILE and RLIMIT_FSIZE always,
RLIMIT_AS and RLIMIT_NPROC when configured, no file descriptor but 0, 1, 2, and
PR_SET_PDEATHSIG=SIGKILL (an agent that dies takes its running child with it), at nice
value --run-nice (by default 19 with --container, where the agent then preempts it at
once, and 0 without).
No run is a fork of the agent, whose heap still holds earlier requests: each is a
"spare" forked ahead of time from the agent's zygote, a process forked before the
agent read any request (see the zygote module), and handed its plan and pipes over a
socket pair.  Code runs as the agent's uid, so the agent, the zygote and idle spares
are non-dumpable (code cannot ptrace them, nor read or write their memory,
descriptors or environment through /proc; a run is dumpable again, as a normal
process), and a seccomp filter of the agent's refuses every process it starts
ptrace, process_vm_readv/writev, pidfd_getfd and prlimit64 on another process.
Python code runs in the spare itself (interpreter already loaded; behaves as
``python3 -c``: __main__, atexit, non-daemon threads joined, traceback + exit 1 on an
uncaught exception); spares keep the zygote's hash seed, so set iteration order
repeats across executions.  Other languages exec a real binary with the code in a file
under ``<workdir>/.temper/``, removed afterwards.  The language table maps a
name to "python-fork", an argv template (``{file}`` = the code file, ``{workdir}``) or
``{"argv": [...], "suffix": ".c", "needs": "gcc"}`` (``needs``: the program that must be
installed, else the run is an infra_error; default argv[0]); ``--languages`` JSON
entries are merged over the defaults (null removes one).  The defaults: python, bash,
sh and c (gcc: built in the code's directory, then run; that directory goes afterwards).
Request files never pass through a symlink and only replace regular files (anything
else is a bad request).

When the main process exits, its process group is killed: at once if the pipes are
closed, else after a 50 ms grace (a background child holding stdout open cannot hang
the exec).  The leader is reaped only after that kill, so the group id cannot have been
reused.  With ``--container``, a timeout, an output limit, a cancellation or an expired
grace also kills every other process but PID 1, the agent, its zygote and spares
(children that setsid() away); a process that left the group quietly survives until
``reset``.
"""

from .main import main
from .options import parse_options
from .processes import being_killed, pending_signals, running_child

__all__ = ["being_killed", "main", "parse_options", "pending_signals", "running_child"]
