"""The workdir: request files, snapshots, and the scratch places reset empties."""

from __future__ import annotations

import contextlib
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


def reopen_workdir(workdir: str) -> None:
    """Give the owner its bits on the workdir back (code ran ``chmod 000 .``): a run must
    start there, and what code did to its own workspace is its doing, not a setup failure."""
    try:
        mode = stat.S_IMODE(os.stat(workdir).st_mode)
        if mode & 0o700 != 0o700:
            os.chmod(workdir, mode | 0o700)
    except OSError:
        return  # gone (reset recreates it): the run's own setup says so


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
    """Keep regular files, directories and symlinks (as links, never followed), owned by
    nobody in particular; no setuid, setgid or sticky bit."""
    if not (info.isfile() or info.isdir() or info.issym()):
        return None
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mode &= 0o755
    return info


def _opened_up(workdir: str) -> dict[str, int]:
    """Let the owner read every file and enter every directory, whatever code chmod-ed
    (the agent owns them); the modes taken away, by path, to be put back afterwards."""
    changed: dict[str, int] = {}
    for top, dirs, files in os.walk(workdir):
        for name in dirs + files:
            path = os.path.join(top, name)
            mode = os.lstat(path).st_mode
            wanted = 0o500 if stat.S_ISDIR(mode) else 0o400 if stat.S_ISREG(mode) else 0
            if wanted and stat.S_IMODE(mode) & wanted != wanted:
                os.chmod(path, stat.S_IMODE(mode) | wanted)
                changed[path] = stat.S_IMODE(mode)
        # os.walk lists a directory after its parent was opened up above.
    return changed


def archive_workdir(workdir: str) -> bytes:
    """The workdir as a tar.gz, with the modes code left (even 000); a file that cannot be
    read is the workdir's state, not the agent's failure: a BadRequest."""
    os.chmod(workdir, 0o700)  # code may have taken the workdir's own bits away
    try:
        changed = _opened_up(workdir)
    except OSError as exc:
        raise BadRequest(f"archive: {exc}") from None
    try:
        # Checked before compressing: 40 MiB of random bytes would take the archive past
        # its time limit on a busy host, and could never fit anyway.
        size = _raw_size(workdir)
        if size > MAX_ARCHIVE_BYTES:
            raise BadRequest(f"archive: {size} bytes of files, over {MAX_ARCHIVE_BYTES}")
        return _archive(workdir, changed)
    except (OSError, RecursionError) as exc:
        raise BadRequest(f"archive: {exc}") from None
    finally:
        for path, mode in sorted(changed.items(), reverse=True):
            with contextlib.suppress(OSError):
                os.chmod(path, mode)


def _raw_size(workdir: str) -> int:
    """Bytes of the regular files under workdir (links not followed)."""
    total = 0
    for top, _, files in os.walk(workdir):
        for name in files:
            info = os.lstat(os.path.join(top, name))
            total += info.st_size if stat.S_ISREG(info.st_mode) else 0
    return total


def _archive(workdir: str, changed: dict[str, int]) -> bytes:
    def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        original = changed.get(os.path.join(workdir, info.name))
        if original is not None:
            info.mode = original
        return _plain(info)

    buffer = io.BytesIO()
    # Level 1: a work directory of random bytes must not take the archive past its time
    # limit (level 9 is several times slower for little gain on such data).
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=1) as tar:
        for name in sorted(os.listdir(workdir)):
            if name != CODE_DIR:
                tar.add(os.path.join(workdir, name), arcname=name, filter=keep)
    if buffer.tell() > MAX_ARCHIVE_BYTES:
        raise BadRequest(f"archive: {buffer.tell()} bytes, over {MAX_ARCHIVE_BYTES}")
    return buffer.getvalue()


def extract_workdir(workdir: str, data: bytes) -> int:
    """Replace the workdir's content with an archive's; everything is checked first.
    Symlinks come back as links and modes as they were, both after every file is written
    (no write passes through a link or needs a mode the archive takes away)."""
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            members = [(m, check_relpath(m.name)) for m in tar.getmembers()]
            for member, rel in members:
                if not (member.isfile() or member.isdir() or member.issym()):
                    raise BadRequest(f"extract: {rel!r} is not a regular file or directory")
            files = {rel: _member_bytes(tar, m) for m, rel in members if m.isfile()}
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise BadRequest(f"extract: not a snapshot archive ({exc})") from None
    empty_dir(workdir)
    for member, rel in members:
        if member.isdir():
            _make_parents(workdir, os.path.join(rel, "x"))
    write_files(workdir, files)
    for member, rel in members:
        if member.issym():
            _make_parents(workdir, rel)
            os.symlink(member.linkname, os.path.join(workdir, rel))
    # Deepest first: a directory's own mode may forbid reaching what it holds.
    for member, rel in sorted(members, key=lambda item: item[1].count(os.sep), reverse=True):
        if not member.issym():
            os.chmod(os.path.join(workdir, rel), member.mode & 0o755)
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
