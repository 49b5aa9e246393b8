"""The file rules every writer of calls follows (a dump, a store, a rendered trace, a fixed dump, an export).

Call records hold the token ids of private conversations, so: files are created 0600 (an existing one of
ours is narrowed, another user's refused), never opened through a symbolic link (O_NOFOLLOW), only regular
files (no FIFO, device or socket); directories 0700; whole files (Parquet) written to a new temporary with
O_EXCL and renamed into place. `strata_lab.dump.writer` builds the JSONL writer (`Recorder`,
`write_records`) on these; `strata_lab.dump.store_writer` the store's directories and segments.

Every file a command writes (a dump, a trace, a CSV, a JSON report, a plot) also follows two output rules:
`check_output` refuses, before any work, an output that resolves to one of the command's inputs (the same
path, a symbolic or hard link to it, or a path inside an input directory) or that is not a regular file (a
FIFO would hang the writer); `replaced_output` has the writer fill a temporary beside the target and renames
it into place only when the command succeeds, so a run that fails part-way leaves the previous file (or none).
"""
from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
import stat
import warnings
from typing import Iterable, Iterator

__all__ = ["open_private", "private_dir", "write_private_file", "same_file", "check_output", "replaced_output"]


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


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Whether two paths name one file: the same resolved path (symbolic links followed) or the same
    device and inode (a hard link). A path that does not exist is compared by its resolved path only."""
    a, b = os.fspath(a), os.fspath(b)
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        sa, sb = os.stat(a), os.stat(b)
    except OSError:
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def _inside(path: str, folder: str) -> bool:
    """Whether `path` (resolved) lies inside the directory `folder` (resolved)."""
    real, root = os.path.realpath(path), os.path.realpath(folder)
    return real != root and os.path.commonpath([real, root]) == root


def check_output(path: str | os.PathLike | None, inputs: Iterable, option: str, *,
                 directory: bool = False) -> None:
    """Refuse (ValueError naming `option`) an output that would overwrite an input or cannot be written whole:
    one of `inputs` (same path, a symbolic or hard link to it), a path inside an input directory, an input
    inside the output directory (`directory`: the output is a directory), or an existing thing other than a
    regular file (a directory unless `directory`; a FIFO or device would hang or never end). None: no output.

    >>> import os, tempfile
    >>> d = tempfile.mkdtemp(); src = os.path.join(d, "log.jsonl"); _ = open(src, "w").write("{}")
    >>> os.link(src, os.path.join(d, "twin.jsonl"))
    >>> check_output(os.path.join(d, "twin.jsonl"), [src], "--out")
    Traceback (most recent call last):
    ...
    ValueError: --out ... is the input ...log.jsonl (a link to it); name another file
    >>> check_output(os.path.join(d, "new.jsonl"), [src], "--out")
    """
    if path is None:
        return
    p = os.fspath(path)
    if not p:
        raise ValueError(f"{option}: an empty path; name a file")
    for src in inputs:
        if src is None:
            continue
        src = os.fspath(src)
        if not os.path.lexists(src):
            continue
        if same_file(p, src):
            how = "" if os.path.abspath(p) == os.path.abspath(src) else " (a link to it)"
            raise ValueError(f"{option} {p} is the input {src}{how}; name another file")
        if os.path.isdir(src) and _inside(p, src):
            raise ValueError(f"{option} {p} is inside the input directory {src}; name a file outside it")
        if directory and _inside(src, p):
            raise ValueError(f"{option} {p} holds the input {src}; name another directory")
    try:
        st = os.stat(p)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise ValueError(f"{option} {p}: cannot use it ({exc.strerror})") from None
    if st is not None and not stat.S_ISREG(st.st_mode) and not (directory and stat.S_ISDIR(st.st_mode)):
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file (a FIFO, device or socket)"
        raise ValueError(f"{option} {p} is {kind}; name a file")
    folder = os.path.dirname(os.path.abspath(p))
    if not os.path.isdir(folder):
        raise ValueError(f"{option} {p}: the folder {folder} does not exist")


@contextlib.contextmanager
def replaced_output(path: str | os.PathLike, *, directory: bool = False) -> Iterator[str]:
    """Write an output whole or not at all: yields a new temporary path beside `path` (its name ends with
    `path`'s own name, so writers that go by the extension still see it); when the block ends without an
    exception the temporary replaces `path` (a symbolic link at `path` is replaced, its target never
    written), else it is removed and `path` is left as it was. A block that writes nothing there leaves
    `path` as it was too. With `directory` (a store), an existing directory is written in place (stores
    append; their own open markers cover a crash) and a new one is made under the temporary name first.

    >>> import os, tempfile
    >>> d = tempfile.mkdtemp(); out = os.path.join(d, "report.json")
    >>> _ = open(out, "w").write("old")
    >>> try:
    ...     with replaced_output(out) as tmp:
    ...         _ = open(tmp, "w").write("half")
    ...         raise RuntimeError("the reader died")
    ... except RuntimeError:
    ...     pass
    >>> open(out).read(), sorted(os.listdir(d))
    ('old', ['report.json'])
    """
    p = os.fspath(path)
    if directory and os.path.isdir(p):
        yield p
        return
    folder, name = os.path.split(os.path.abspath(p))
    tmp = os.path.join(folder, f".tmp-{secrets.token_hex(6)}-{name}")
    try:
        yield tmp
        if os.path.lexists(tmp):
            os.replace(tmp, p)
    finally:
        if os.path.lexists(tmp):
            if os.path.isdir(tmp) and not os.path.islink(tmp):
                shutil.rmtree(tmp, ignore_errors=True)
            else:
                os.unlink(tmp)
