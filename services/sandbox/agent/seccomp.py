"""The agent's own seccomp filter (see the comment below)."""

from __future__ import annotations

import errno
import os
import struct

from .libc import load_libc, prctl

#
# Code runs with the agent's uid, so the agent, the zygote and idle spares are made
# non-dumpable: the kernel then refuses code ptrace and /proc/<pid>/mem on them.  On
# top of that (and of Docker's profile: filters stack) the agent installs a seccomp
# filter of its own, inherited by every process it starts, that answers EPERM to the
# calls reaching into another process: ptrace, process_vm_readv/writev and
# pidfd_getfd, plus prlimit64 on another process (a lowered hard limit of the agent,
# zygote or a spare would outlive the task that set it).  x32 calls are refused
# whole (nothing here uses that ABI).

PR_SET_SECCOMP = 22
PR_SET_NO_NEW_PRIVS = 38
SECCOMP_MODE_FILTER = 2
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_EPERM = 0x00050000 | errno.EPERM
AUDIT_ARCH_X86_64 = 0xC000003E
AUDIT_ARCH_I386 = 0x40000003
AUDIT_ARCH_AARCH64 = 0xC00000B7
AUDIT_ARCH_ARM = 0x40000028
X32_SYSCALL_BIT = 0x40000000
#: Per audit arch: (ptrace, process_vm_readv, process_vm_writev, pidfd_getfd), prlimit64.
DENIED_SYSCALLS = {
    AUDIT_ARCH_X86_64: ((101, 310, 311, 438), 302),
    AUDIT_ARCH_I386: ((26, 347, 348, 438), 340),  # int 0x80 from a 64-bit process too
    AUDIT_ARCH_AARCH64: ((117, 270, 271, 438), 261),
    AUDIT_ARCH_ARM: ((26, 376, 377, 438), 369),
}
#: uname -m -> the audit arches its processes can make calls as (native, compat).
MACHINE_ARCHES = {
    "x86_64": (AUDIT_ARCH_X86_64, AUDIT_ARCH_I386),
    "aarch64": (AUDIT_ARCH_AARCH64, AUDIT_ARCH_ARM),
}
BPF_LD_W_ABS, BPF_JEQ_K, BPF_JGE_K, BPF_RET_K = 0x20, 0x15, 0x35, 0x06
#: struct seccomp_data: the call's number, its arch, the low word of its first argument.
SECCOMP_NR, SECCOMP_ARCH, SECCOMP_ARG0_LOW = 0, 4, 16
BPF_INSN = struct.Struct("=HBBI")

#: One BPF instruction (code, k, jump-if-true label, jump-if-false label), or a label.
Insn = tuple[int, int, str | None, str | None] | str


def assemble_bpf(program: list[Insn]) -> bytes:
    """Classic BPF from instructions whose jumps name labels (forward only)."""
    position, offsets = 0, {}
    for item in program:
        if isinstance(item, str):
            offsets[item] = position
        else:
            position += 1
    out, position = bytearray(), 0
    for item in program:
        if isinstance(item, str):
            continue
        code, k, if_true, if_false = item
        jt = offsets[if_true] - position - 1 if if_true else 0
        jf = offsets[if_false] - position - 1 if if_false else 0
        out += BPF_INSN.pack(code, jt, jf, k)
        position += 1
    return bytes(out)


def seccomp_program(machine: str) -> bytes | None:
    """The filter for this machine's arches; None for a machine we have no table for."""
    arches = MACHINE_ARCHES.get(machine)
    if arches is None:
        return None
    program: list[Insn] = [(BPF_LD_W_ABS, SECCOMP_ARCH, None, None)]
    program += [(BPF_JEQ_K, arch, f"arch-{arch}", None) for arch in arches]
    program.append((BPF_RET_K, SECCOMP_RET_EPERM, None, None))  # any other arch
    for arch in arches:
        denied, prlimit64 = DENIED_SYSCALLS[arch]
        program += [f"arch-{arch}", (BPF_LD_W_ABS, SECCOMP_NR, None, None)]
        if arch == AUDIT_ARCH_X86_64:
            program.append((BPF_JGE_K, X32_SYSCALL_BIT, "deny", None))
        program += [(BPF_JEQ_K, nr, "deny", None) for nr in denied]
        program += [(BPF_JEQ_K, prlimit64, "prlimit64", "allow")]
    program += [
        "prlimit64",
        (BPF_LD_W_ABS, SECCOMP_ARG0_LOW, None, None),
        (BPF_JEQ_K, 0, "allow", "deny"),  # pid 0 is the caller itself
        "allow",
        (BPF_RET_K, SECCOMP_RET_ALLOW, None, None),
        "deny",
        (BPF_RET_K, SECCOMP_RET_EPERM, None, None),
    ]
    return assemble_bpf(program)


def install_seccomp_filter() -> str | None:
    """Install the filter above on this process (and so its descendants); None, or why not."""
    machine = os.uname().machine
    program = seccomp_program(machine)
    libc = load_libc()
    if program is None or libc is None:
        return f"no syscall table for {machine}" if libc else "no libc"
    import ctypes

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]

    fprog = SockFprog(len(program) // BPF_INSN.size, program)
    # Without no_new_privs an unprivileged process may not install a filter; Docker and
    # bubblewrap set it already, the plain local backend gets it here.
    if not prctl(PR_SET_NO_NEW_PRIVS, 1) or not prctl(
        PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog)
    ):
        return os.strerror(ctypes.get_errno())
    return None
