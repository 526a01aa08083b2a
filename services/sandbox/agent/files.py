"""The workdir: request files, snapshots, and the scratch places reset empties."""

from __future__ import annotations

import errno
import io
import os
import stat
import tarfile
from typing import Any

from .common import CODE_DIR, BadRequest
from .protocol import check_relpath

#: A snapshot must fit in one frame once base64-encoded.
MAX_ARCHIVE_BYTES = 40 * 1024 * 1024
IPC_RMID = 0
#: Writable places of a sandbox container besides the workdir, emptied by reset.
CONTAINER_SCRATCH = ("/tmp", "/dev/shm", "/dev/mqueue")


def _make_parents(root: str, rel: str) -> None:
    """Create the directories of rel under root, refusing to pass through a symlink."""
    current = root
    for part in os.path.dirname(rel).split(os.sep) if os.path.dirname(rel) else ():
        current = os.path.join(current, part)
        try:
            os.mkdir(current, 0o755)
        except FileExistsError:
            if os.path.islink(current) or not os.path.isdir(current):
                raise BadRequest(f"files: {rel!r}: {part!r} is not a directory") from None


def write_files(workdir: str, files: dict[str, bytes]) -> None:
    """Write request files under workdir (rel paths from check_relpath); no symlink is followed."""
    for rel, data in files.items():
        _make_parents(workdir, rel)
        # O_NONBLOCK: a FIFO planted by earlier code fails (ENXIO) instead of blocking us.
        flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            fd = os.open(os.path.join(workdir, rel), flags, 0o644)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
                raise BadRequest(f"files: {rel!r} is not a regular file") from None
            raise
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise BadRequest(f"files: {rel!r} is not a regular file")
            os.set_blocking(fd, True)
            os.ftruncate(fd, 0)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)


def remove_tree(path: str) -> None:
    """Remove a directory tree, restoring permissions that code may have taken away."""
    os.chmod(path, 0o700)
    with os.scandir(path) as entries:
        items = list(entries)
    for entry in items:
        if entry.is_dir(follow_symlinks=False):
            remove_tree(entry.path)
        else:
            os.unlink(entry.path)
    os.rmdir(path)


def empty_dir(path: str, chmod: bool = True) -> None:
    """Remove what path holds; chmod=False for a directory we do not own (/dev/shm)."""
    if chmod:
        os.chmod(path, 0o700)
    with os.scandir(path) as entries:
        items = list(entries)
    for entry in items:
        if entry.is_dir(follow_symlinks=False):
            remove_tree(entry.path)
        else:
            os.unlink(entry.path)


def _plain(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    """Keep regular files and directories only, owned by nobody in particular."""
    if not (info.isfile() or info.isdir()):
        return None
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mode &= 0o755
    return info


def archive_workdir(workdir: str) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name in sorted(os.listdir(workdir)):
            if name != CODE_DIR:
                tar.add(os.path.join(workdir, name), arcname=name, filter=_plain)
    if buffer.tell() > MAX_ARCHIVE_BYTES:
        raise BadRequest(f"archive: {buffer.tell()} bytes, over {MAX_ARCHIVE_BYTES}")
    return buffer.getvalue()


def extract_workdir(workdir: str, data: bytes) -> int:
    """Replace the workdir's content with an archive's; everything is checked first."""
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            members = [(m, check_relpath(m.name)) for m in tar.getmembers()]
            for member, rel in members:
                if not (member.isfile() or member.isdir()):
                    raise BadRequest(f"extract: {rel!r} is not a regular file or directory")
            files = {rel: _member_bytes(tar, m) for m, rel in members if m.isfile()}
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise BadRequest(f"extract: not a snapshot archive ({exc})") from None
    empty_dir(workdir)
    for member, rel in members:
        if member.isdir():
            _make_parents(workdir, os.path.join(rel, "x"))
    write_files(workdir, files)
    return len(files)


def _member_bytes(tar: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    handle = tar.extractfile(member)
    return handle.read() if handle is not None else b""


def remove_sysv_ipc(libc: Any) -> None:
    """Remove every SysV IPC object (the container's IPC namespace is its own)."""
    if libc is None:
        return
    import ctypes

    for kind, ctl in (("shm", libc.shmctl), ("msg", libc.msgctl), ("sem", libc.semctl)):
        try:
            with open(f"/proc/sysvipc/{kind}") as f:
                ids = [int(row.split()[1]) for row in f.read().splitlines()[1:] if row.strip()]
        except OSError:
            continue
        for ident in ids:
            args = (ident, 0, IPC_RMID) if kind == "sem" else (ident, IPC_RMID, None)
            if ctl(*args) != 0 and ctypes.get_errno() not in (errno.EINVAL, errno.EIDRM):
                raise OSError(ctypes.get_errno(), f"cannot remove SysV {kind} {ident}")


def wipe_container_scratch(libc: Any) -> None:
    """Empty the container's writable places besides the workdir; drop SysV IPC objects."""
    for path in CONTAINER_SCRATCH:
        if os.path.isdir(path):
            empty_dir(path, chmod=False)
    remove_sysv_ipc(libc)


def remove_scratch(path: str) -> None:
    """Remove the code directory with what a run built there; reset sees to anything left."""
    try:
        if stat.S_ISDIR(os.lstat(path).st_mode):
            remove_tree(path)
    except (OSError, RecursionError):
        pass


def read_outputs(workdir: str, paths: tuple[str, ...], budget: int) -> dict[str, bytes]:
    """The regular files at ``paths`` (from check_relpath), in order, while their total
    fits in ``budget`` bytes; any other is left out.  No symlink is followed on the way:
    one could point the agent at its own /proc entries, which hold earlier requests."""
    found: dict[str, bytes] = {}
    for rel in paths:
        data = _read_regular(workdir, rel, budget)
        if data is not None:
            found[rel] = data
            budget -= len(data)
    return found


def _read_regular(workdir: str, rel: str, limit: int) -> bytes | None:
    *parents, name = rel.split(os.sep)
    walk = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(workdir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        for part in parents:
            fd, parent = os.open(part, walk, dir_fd=fd), fd
            os.close(parent)
        # O_NONBLOCK: a FIFO left there fails or reads empty instead of blocking us.
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        fd, parent = os.open(name, flags, dir_fd=fd), fd
        os.close(parent)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = _read_at_most(fd, limit + 1)
        return data if len(data) <= limit else None
    except OSError:
        return None
    finally:
        os.close(fd)


def _read_at_most(fd: int, size: int) -> bytes:
    chunks, left = [], size
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)
