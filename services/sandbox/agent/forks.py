"""How the zygote forks a spare as the agent's own child (not its own)."""

from __future__ import annotations

import errno
import json
import os
import signal
import struct
from collections.abc import Callable
from dataclasses import dataclass

from .libc import load_libc

SPARE_PID = struct.Struct("=i")


class MiddleFork:
    """A sibling by forking twice: the middle process exits, its child goes to the agent
    (PID 1, or a subreaper).  Costs a fork and an exit more than SiblingFork."""

    def __init__(self) -> None:
        self.pid_r, self.pid_w = os.pipe()
        os.set_blocking(self.pid_r, False)

    def __call__(self) -> int:
        """The child's pid (0 in the child); OSError when a fork failed."""
        middle = os.fork()
        if middle == 0:
            self._middle()  # returns in the grandchild only
            return 0
        os.waitpid(middle, 0)  # once it is gone, the grandchild is the agent's
        try:
            raw = os.read(self.pid_r, SPARE_PID.size)
        except BlockingIOError:  # its fork failed
            raw = b""
        if len(raw) != SPARE_PID.size:
            raise OSError(errno.EAGAIN, "the middle process could not fork")
        return int(SPARE_PID.unpack(raw)[0])

    def _middle(self) -> None:
        try:
            child = os.fork()
            if child == 0:
                os.close(self.pid_r)
                os.close(self.pid_w)
                return
            os.write(self.pid_w, SPARE_PID.pack(child))
        except BaseException:
            pass
        os._exit(0)


#: uname -m -> clone, get_robust_list and set_robust_list, and whether clone takes its
#: child_tid argument before tls (x86_64) or after it (the others).
CLONE_CALLS = {"x86_64": (56, 274, 273, True), "aarch64": (220, 100, 99, False)}
CLONE_PARENT = 0x00008000
CLONE_CHILD_SETTID = 0x01000000
#: glibc keeps a thread's id this far at most into its struct pthread (720 on 2.36),
#: which is longer than that.
TID_SCAN_BYTES = 1024


@dataclass(frozen=True, slots=True)
class SiblingFork:
    """fork(2) whose child is the caller's parent's child: clone(CLONE_PARENT).

    Python has no clone(), so it goes through ctypes, with what os.fork() and glibc's
    fork() do around the call: the interpreter's fork hooks (PyOS_*Fork*), the new
    thread id stored where glibc keeps it (CLONE_CHILD_SETTID; the place is found once,
    by ``probe``) and the robust futex list registered again.  ``probe`` gives None
    wherever any of that is unsure, and the zygote forks twice instead (MiddleFork).
    """

    syscall: Callable[..., int]
    clone_nr: int
    set_robust_list_nr: int
    child_tid_first: bool
    tid_address: int
    robust_head: int
    robust_len: int

    @classmethod
    def probe(cls) -> SiblingFork | None:
        calls = CLONE_CALLS.get(os.uname().machine)
        if calls is None or load_libc() is None:
            return None
        import ctypes

        syscall = ctypes.PyDLL(None, use_errno=True).syscall  # keeps the GIL, as os.fork
        syscall.restype = ctypes.c_long
        syscall.argtypes = [ctypes.c_long] * 6  # (variadic: longs, and always six)
        pthread_self = load_libc().pthread_self
        pthread_self.restype = ctypes.c_void_p
        self_address = pthread_self()
        head, length = ctypes.c_void_p(), ctypes.c_size_t()
        got = syscall(calls[1], 0, ctypes.addressof(head), ctypes.addressof(length), 0, 0)
        offset = _tid_offset(self_address) if self_address else None
        if got != 0 or offset is None or not head.value:
            return None
        return cls(
            syscall, calls[0], calls[2], calls[3], self_address + offset, head.value, length.value
        )

    def __call__(self) -> int:
        """The child's pid (0 in the child); OSError when clone failed."""
        import ctypes

        flags = CLONE_PARENT | CLONE_CHILD_SETTID | signal.SIGCHLD
        tids = (0, self.tid_address, 0) if self.child_tid_first else (0, 0, self.tid_address)
        ctypes.pythonapi.PyOS_BeforeFork()
        pid = self.syscall(self.clone_nr, flags, 0, *tids)
        if pid == 0:
            self.syscall(self.set_robust_list_nr, self.robust_head, self.robust_len, 0, 0, 0)
            ctypes.pythonapi.PyOS_AfterFork_Child()
            return 0
        error = ctypes.get_errno()
        ctypes.pythonapi.PyOS_AfterFork_Parent()
        if pid < 0:
            raise OSError(error, f"clone: {os.strerror(error)}")
        return int(pid)


def _tid_offset(self_address: int) -> int | None:
    """Where glibc keeps this (main) thread's id in its struct pthread, if sure.

    Its id is the pid here; a child that glibc forked has its own pid there.  The one
    place that holds both is the field: any other is a coincidence, and more than one
    place (or none) means unsure.
    """
    import ctypes

    def places(value: int) -> set[int]:
        raw = ctypes.string_at(self_address, TID_SCAN_BYTES)
        return {
            at for at in range(0, TID_SCAN_BYTES, 4) if raw[at : at + 4] == SPARE_PID.pack(value)
        }

    here = places(os.getpid())
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:
        try:
            os.write(write_end, json.dumps(sorted(places(os.getpid()))).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with open(read_end, "rb") as answer:
        there = answer.read()
    os.waitpid(child, 0)
    both = here & set(json.loads(there or b"[]"))
    return both.pop() if len(both) == 1 else None
