"""The file rules every writer of calls follows (a dump, a store, a rendered trace, a fixed dump, an export).

Call records hold the token ids of private conversations, so: files are created 0600 (an existing one of
ours is narrowed, another user's refused), never opened through a symbolic link (O_NOFOLLOW), only regular
files (no FIFO, device or socket); directories 0700; whole files (Parquet) written to a new temporary with
O_EXCL and renamed into place. `strata_lab.dump.writer` builds the JSONL writer (`Recorder`,
`write_records`) on these; `strata_lab.dump.store_writer` the store's directories and segments.
"""
from __future__ import annotations

import errno
import os
import stat
import warnings

__all__ = ["open_private", "private_dir", "write_private_file"]


def _open_dump(path: str, *, truncate: bool = False, what: str = "dump") -> int:
    """Open `path` for appending: never through a symbolic link, only a regular file, mode 0600 at most.

    A file someone else made readable (0644) is narrowed to 0600 with a warning; one we cannot narrow
    (another owner) is refused. O_NONBLOCK keeps a FIFO from hanging the open; it is refused right after.
    """
    flags = (os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)
             | getattr(os, "O_NONBLOCK", 0))
    try:
        # an explicit mode: the file is never world-readable, not even for an instant
        fd = os.open(path, flags, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ValueError(f"{what} {path} is a symbolic link; refusing to follow it (name the target)") from None
        if exc.errno == errno.EISDIR:
            raise ValueError(f"{what} {path} is a directory; name a file") from None
        if exc.errno == errno.ENXIO:
            raise ValueError(f"{what} {path} is not a regular file (a FIFO with no reader)") from None
        raise ValueError(f"{what} {path}: cannot open it for writing ({exc.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{what} {path} is not a regular file (a device, FIFO or socket); name a file")
        if st.st_mode & 0o077:
            if st.st_uid != os.geteuid():
                raise ValueError(f"{what} {path} has mode {oct(st.st_mode & 0o777)} and belongs to another user; "
                                 "dumps hold private conversations and must be 0600")
            os.fchmod(fd, 0o600)
            warnings.warn(f"{what} {path} had mode {oct(st.st_mode & 0o777)}; narrowed it to 0600 (dumps hold "
                          "private conversations)", stacklevel=4)
        if truncate:
            os.ftruncate(fd, 0)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_private(path: str | os.PathLike, *, truncate: bool = False, what: str = "dump") -> int:
    """A descriptor for writing `path` (O_APPEND; emptied first with `truncate`) with the dump's safety rules:
    no symbolic link, a regular file, mode 0600 (an existing file of ours narrowed, another user's refused)."""
    return _open_dump(os.fspath(path), truncate=truncate, what=what)


def private_dir(path: str | os.PathLike, *, what: str = "store") -> str:
    """Make `path` (and its missing parents) with mode 0700; an existing one must be a directory, not a
    symbolic link, and is narrowed to 0700 when it is ours and open to others. Returns the path."""
    p = os.fspath(path)
    p = p.rstrip(os.sep) or p  # "calls/" names the directory itself (lstat must not follow a link)
    missing = []
    cur = p
    while cur and not os.path.lexists(cur):
        missing.append(cur)
        parent = os.path.dirname(cur.rstrip(os.sep))
        if parent == cur:
            break
        cur = parent
    for d in reversed(missing):
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            pass
    try:
        st = os.lstat(p)
    except OSError as exc:
        raise ValueError(f"{what} {p}: cannot make it ({exc.strerror})") from None
    if stat.S_ISLNK(st.st_mode):
        raise ValueError(f"{what} {p} is a symbolic link; refusing to follow it (name the target)")
    if not stat.S_ISDIR(st.st_mode):
        raise ValueError(f"{what} {p} is not a directory")
    if st.st_mode & 0o077:
        if st.st_uid != os.geteuid():
            raise ValueError(f"{what} {p} has mode {oct(st.st_mode & 0o777)} and belongs to another user; it "
                             "holds private conversations and must be 0700")
        os.chmod(p, 0o700)
    return p


def write_private_file(path: str | os.PathLike, write, *, what: str = "file") -> str:
    """Write a whole file atomically: `write(f)` fills a new 0600 temporary beside `path` (created with
    O_EXCL | O_NOFOLLOW), which then replaces `path`. `path` itself must not be a symbolic link (refused)
    or anything but a regular file; readers never see half a file."""
    p = os.fspath(path)
    if os.path.islink(p):
        raise ValueError(f"{what} {p} is a symbolic link; refusing to follow it (name the target)")
    if os.path.lexists(p) and not os.path.isfile(p):
        raise ValueError(f"{what} {p} is not a regular file")
    tmp = p + ".tmp"
    if os.path.lexists(tmp):  # left by a crash, or planted: removing a link never touches its target
        os.unlink(tmp)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(tmp, flags, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, p)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return p
