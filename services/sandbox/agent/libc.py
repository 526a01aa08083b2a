"""libc through ctypes: prctl, for the agent, its helpers and runs."""

from __future__ import annotations

import functools
from typing import Any

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36


@functools.cache
def load_libc() -> Any:
    """libc through ctypes (standard library, but optional in minimal builds); None without.

    Loaded once, by the agent before it forks the zygote, so no run pays for it.
    """
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
    except (ImportError, OSError):
        return None
    # Its arguments are unsigned longs: say so, or ctypes passes ints (and pointers) as C ints.
    libc.prctl.argtypes = (ctypes.c_int, *[ctypes.c_ulong] * 4)
    return libc


def prctl(option: int, value: int, arg3: int = 0) -> bool:
    """prctl(option, value, arg3, 0, 0); False where it failed or libc is not reachable."""
    libc = load_libc()
    return libc is not None and libc.prctl(option, value, arg3, 0, 0) == 0
