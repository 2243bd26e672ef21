"""Files Bob reads and writes: reads that fail with a one-line BadInput, outputs checked
before any work, atomic writes.

Ground floor: it imports only ``bob.errors``, so any layer may use it.

A file Bob reads is a regular file; a FIFO, socket or device is refused unopened
(opening a FIFO blocks until a writer comes). Data inputs (texts, token files,
input records) also take a stream: a pipe (bash's ``<(...)``), a FIFO or a
character device, read through once. A stream has no size up front, so its
reader bounds what it reads and names the bound when a stream goes past it.

An atomic write goes to a temporary file in the target's directory, is flushed
and fsynced, renamed over the target, and the directory is fsynced, so a crash
at any moment leaves either the old file or the new one, never a mix. A failed
write removes its temporary and leaves the old file untouched. A symbolic link
stays a link: the file it points to is the one replaced.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import re
import socket
import stat
import struct
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import BinaryIO

from bob.errors import BadInput, RunFailure, size_text

Writer = Callable[[BinaryIO], None]
StrPath = str | os.PathLike[str]

TEMP_SUFFIX = ".tmp"
READ_CHUNK = 1 << 24  # a stream read whole comes in pieces of 16 MiB
# Inode flags that chattr sets (linux/fs.h): the rename over such a file fails, even as root.
FS_IOC_GETFLAGS = 0x80006601 | (struct.calcsize("l") << 16)  # _IOR('f', 1, long)
FS_IMMUTABLE_FL = 0x10
FS_APPEND_FL = 0x20


@contextlib.contextmanager
def reading(path: StrPath, what: str = "file") -> Iterator[BinaryIO]:
    """`path` open for binary reading; a failure to open or read it is a BadInput naming it.

    `what` names the expected kind where a directory stands in its place. A FIFO, socket
    or device is refused before it is opened (opening a FIFO blocks until a writer comes).
    """
    require_regular_file(path, what)
    try:
        with Path(path).open("rb") as file:
            yield file
    except OSError as error:
        raise unreadable(path, error, what) from None


def require_named(path: StrPath, what: str = "file") -> None:
    """BadInput for an empty path: the system finds no file there, but pathlib reads it as
    the current directory ("" is Path(".")), which a directory input would then read
    whole and an output would be written into."""
    if os.fspath(path) == "":
        raise BadInput(f"'': an empty path names no {_file_noun(what)}")


def require_regular_file(path: StrPath, what: str = "file") -> None:
    """BadInput unless `path` is a regular file (or a link to one) or a directory (which
    open() then reports): a FIFO, socket or device is "not a regular file", found by stat
    without opening it."""
    require_named(path, what)
    try:
        mode = os.stat(path).st_mode
    except OSError as error:
        raise unreadable(path, error, what) from None
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise BadInput(f"{path}: not a regular file ({special_kind(mode)}, not a {what})")


def special_kind(mode: int) -> str:
    """What a file that is not regular is, in a word or two: "a FIFO", "a socket"..."""
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    return "a special file"


def unreadable(path: StrPath, error: OSError, what: str = "file") -> BadInput:
    """The one-line BadInput for a file that could not be opened or read."""
    if isinstance(error, FileNotFoundError):
        return BadInput(f"{path}: no such file")
    if isinstance(error, IsADirectoryError):
        return BadInput(f"{path}: is a directory, not a {what}")
    if isinstance(error, PermissionError):
        return BadInput(f"{path}: cannot read the file (permission denied)")
    return BadInput(f"{path}: cannot read the file ({error.strerror or error})")


def read_bytes(path: StrPath, what: str = "file") -> bytes:
    """The whole file; BadInput naming it when it is missing or unreadable."""
    with reading(path, what) as file:
        return file.read()


def stream_kind(path: StrPath) -> str | None:
    """"a FIFO" or "a character device" where `path` is one, to be read as a stream (a
    pipe, bash's <(...), /dev/stdin); None otherwise, and where stat fails (the open then
    says why)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    if stat.S_ISFIFO(mode) or stat.S_ISCHR(mode):
        return special_kind(mode)
    return None


@contextlib.contextmanager
def reading_input(path: StrPath, what: str = "file") -> Iterator[BinaryIO]:
    """`path` open for binary reading as `reading` opens it, except that a stream (a FIFO
    or a character device, `stream_kind`) is opened too: a data input read through once,
    whose open waits for the pipe's writer as any reader of a pipe does."""
    if stream_kind(path) is None:
        with reading(path, what) as file:
            yield file
        return
    try:
        with open(path, "rb") as file:  # noqa: PTH123  # the same open as reading()'s
            yield file
    except OSError as error:
        raise unreadable(path, error, what) from None


def read_bounded(file: BinaryIO, name: str, limit: int, bound: str) -> bytes:
    """All of a stream, read a piece at a time; past `limit` bytes, BadInput naming the
    bound (`bound` says what it is), before the stream can fill memory."""
    pieces = []
    total = 0
    while piece := file.read(min(READ_CHUNK, limit + 1 - total)):
        total += len(piece)
        if total > limit:
            raise stream_too_long(name, limit, bound)
        pieces.append(piece)
    return b"".join(pieces)


def stream_too_long(name: str, limit: int, bound: str) -> BadInput:
    """The one line for a stream that goes on past `limit` bytes (`bound` says what that
    is): /dev/zero, say, never ends."""
    return BadInput(f"{name}: the stream goes on past {limit:,} bytes ({size_text(limit)}), "
                    f"{bound}")


def make_directory(path: StrPath) -> None:
    """`path` and its parents as directories; BadInput naming it when that cannot be."""
    try:
        os.makedirs(path, exist_ok=True)
    except FileExistsError:
        raise BadInput(f"{path}: is a file, not a directory") from None
    except OSError as error:
        raise BadInput(f"{path}: cannot create the directory "
                       f"({error.strerror or error})") from None


def check_output_file(path: StrPath, what: str) -> None:
    """BadInput unless `path` can be written as a file: its directory exists and takes a new
    file, no directory or special file stands in its place, and an existing file there may
    be replaced (`require_replaceable`). `what` names the file in the message.

    Every command that writes calls this (or `check_output_directory`) for each output
    before any work, so a path that cannot be written costs nothing.
    """
    require_named(path, what)
    target = write_target(path)
    directory = _require_file_place(target, what, shown=path)
    require_replaceable(target, what, shown=path)
    _require_writable_directory(directory, f"{path}: cannot write the {what} in {directory}")


def check_output_directory(path: StrPath, what: str) -> None:
    """BadInput unless `path` can take the files `what` names: an existing directory that
    takes a new file, or a new one to be made inside an existing directory."""
    if os.fspath(path) == "":
        raise BadInput(f"'': an empty path names no directory for the {what}")
    target = Path(path)
    if target.exists():
        if not target.is_dir():
            raise BadInput(f"{path}: is a file, not a directory for the {what}")
        _require_writable_directory(target, f"{path}: cannot write the {what} there")
        return
    parent = target.absolute().parent
    if not parent.is_dir():
        raise BadInput(f"{path}: directory {parent} does not exist (a directory for the "
                       f"{what} is made only inside an existing one)")
    _require_writable_directory(parent, f"{path}: cannot make the directory for the {what}")


def same_file(first: StrPath, second: StrPath) -> bool:
    """Whether two paths name one file: the same path once links and ".." are resolved,
    or, where both exist, the same inode (a hard link, a bind mount, a path through
    another link to a directory)."""
    if os.path.realpath(first) == os.path.realpath(second):
        return True
    try:
        return os.path.samefile(first, second)
    except OSError:  # either is missing (or unreadable): no inode to compare
        return False


def require_apart(output: StrPath, what: str, inputs: Iterable[tuple[StrPath, str]]) -> None:
    """BadInput when the output `output` (`what` names it) is also one of `inputs` (path,
    what it is) through any alias: writing it would destroy the input, and with it the
    data the output is made from. The message names the output, and the input's own path
    where it is another name of the file."""
    for path, role in inputs:
        if same_file(output, path):
            other = "" if os.fspath(path) == os.fspath(output) else f" {path}"
            raise BadInput(f"{output}: the {role}{other} and the {what} would be one file")


def write_target(path: StrPath) -> Path:
    """The file a write to `path` replaces: `path` itself, or the file a symbolic link
    there points to (so the link stays a link, and every name of the file shares its
    lock)."""
    return Path(os.path.realpath(path)) if os.path.islink(path) else Path(path)


def require_replaceable(path: Path, what: str, shown: StrPath | None = None) -> None:
    """BadInput when a file at `path` is one a write must not replace: read-only (no write
    permission for anyone: made so on purpose, and root would replace it all the same),
    or immutable or append-only (the rename would fail once the work is done). `shown` is
    the path the message names (the user's, where `path` is a link's target)."""
    shown = path if shown is None else shown
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return  # no file yet: nothing to replace
    if not stat.S_ISREG(mode):
        return  # a directory or special file: _require_file_place has refused it
    if not mode & 0o222:
        raise BadInput(f"{shown}: the {what} is read-only (mode {stat.S_IMODE(mode):04o}); "
                       "Bob does not replace a read-only file")
    flags = _inode_flags(path)
    for flag, kind in ((FS_IMMUTABLE_FL, "immutable"), (FS_APPEND_FL, "append-only")):
        if flags & flag:
            raise BadInput(f"{shown}: the {what} is {kind} (chattr +{kind[0]}); Bob cannot "
                           "replace it")


def _inode_flags(path: Path) -> int:
    """The file's chattr flags; 0 where the platform or file system keeps none."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return 0
    try:
        buffer = bytearray(struct.calcsize("l"))
        fcntl.ioctl(fd, FS_IOC_GETFLAGS, buffer)
    except OSError:
        return 0
    finally:
        os.close(fd)
    return int.from_bytes(buffer[:4], "little")


def _require_writable_directory(directory: StrPath, failure: str) -> None:
    """`probe_directory`, then a BadInput where the directory has no write permission for
    anyone: made read-only on purpose, which root would otherwise write through."""
    probe_directory(directory, failure)
    mode = os.stat(directory).st_mode
    if not mode & 0o222:
        raise BadInput(f"{failure} (read-only: mode {stat.S_IMODE(mode):04o})")


def probe_directory(directory: StrPath, failure: str) -> None:
    """Create and remove a file in `directory`: the only sure test that writing works there
    (permissions, read-only mounts, /proc and the like); BadInput `failure (reason)` if not."""
    try:
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".bob-probe-"):
            pass
    except OSError as error:
        raise BadInput(f"{failure} ({error.strerror or error})") from None


def _require_file_place(path: StrPath, what: str | None = None,
                        shown: StrPath | None = None) -> Path:
    """`path`'s directory, after a BadInput unless it exists and neither a directory nor a
    special file (a device, a FIFO: a rename would put a file in its place) stands at
    `path`; `what`, when given, names the file in the message, `shown` the path."""
    shown = path if shown is None else shown
    target = Path(path)
    directory = target.parent
    if not directory.is_dir():
        if directory.exists():
            raise BadInput(f"{shown}: {directory} is a file, not a directory")
        goes = f" (the {what} goes there)" if what else ""
        raise BadInput(f"{shown}: directory {directory} does not exist{goes}")
    kind = f", not a {_file_noun(what)}" if what else ""
    if target.is_dir():
        raise BadInput(f"{shown}: is a directory{kind}")
    try:
        mode = os.stat(target).st_mode
    except OSError:
        return directory  # no file there yet
    if not stat.S_ISREG(mode):
        raise BadInput(f"{shown}: not a regular file ({special_kind(mode)}{kind}); Bob writes "
                       "its outputs as regular files")
    return directory


def _file_noun(what: str) -> str:
    """"checkpoint file", "counts file": `what` with "file" once."""
    return what if what.endswith("file") else f"{what} file"


def atomic_write(path: StrPath, data: bytes | Writer) -> None:
    """Replace `path` (or the file a link there points to) with `data` (bytes, or a
    function writing to a binary file).

    Raises BadInput when the target cannot be a file (missing directory, a
    directory in the way) and RunFailure when writing fails; in both cases the
    old file, if any, is untouched and no temporary is left.
    """
    require_named(path)
    target = write_target(path)
    directory = _require_file_place(target, shown=path)
    temporary = _write_temporary(target, directory, data, path)
    _replace(temporary, target, path)
    _fsync_directory(directory)


def atomic_write_all(files: Mapping[StrPath, bytes | Writer], what: str = "file") -> None:
    """Replace several files (path: data, as `atomic_write` takes them) together.

    Every path is checked first (`check_output_file`), then every file is written to a
    temporary beside its target and fsynced, and only then are they renamed over their
    targets: a failure while writing (a full disk) leaves every old file as it was and
    no temporary. Only a failing rename, after all is written, can leave the files before
    it replaced.
    """
    for path in files:
        check_output_file(path, what)
    staged: list[tuple[str, Path, StrPath]] = []  # temporary, target, the path given
    try:
        for path, data in files.items():
            target = write_target(path)
            directory = _require_file_place(target, shown=path)
            staged.append((_write_temporary(target, directory, data, path), target, path))
    except BaseException:
        for temporary, _, _ in staged:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
        raise
    for index, (temporary, target, path) in enumerate(staged):
        try:
            _replace(temporary, target, path)
        except RunFailure:
            for later, _, _ in staged[index + 1:]:
                with contextlib.suppress(OSError):
                    os.unlink(later)
            raise
    for directory in sorted({target.parent for _, target, _ in staged}):
        _fsync_directory(directory)


def write_directory(directory: StrPath, files: Mapping[str, bytes | Writer],
                    what: str) -> list[Path]:
    """`files` (name: data) into `directory`, made where it is missing (only inside an
    existing one), all or nothing as `atomic_write_all` writes them: a failure leaves the
    directory as it was, and removes one made here. `what` names the files in messages;
    the paths written, in order."""
    check_output_directory(directory, what)
    made = not os.path.isdir(directory)
    if made:
        make_directory(directory)
    paths = {Path(directory) / name: data for name, data in files.items()}
    try:
        atomic_write_all(paths, what)
    except BaseException:
        if made:
            with contextlib.suppress(OSError):
                os.rmdir(directory)  # empty again: the writes removed their temporaries
        raise
    return list(paths)


def _write_temporary(target: Path, directory: Path, data: bytes | Writer,
                     shown: StrPath) -> str:
    """A temporary beside `target` holding `data`, flushed and fsynced; on a failure it is
    removed and the error raised (an OSError as RunFailure naming `shown`)."""
    _remove_stale_temporaries(target)
    mode = _file_mode(target)
    try:
        fd, temporary = tempfile.mkstemp(
            prefix=_temp_prefix(target), suffix=TEMP_SUFFIX, dir=directory)
    except OSError as error:
        raise RunFailure(f"{shown}: cannot write ({error.strerror or error})") from None
    try:
        with os.fdopen(fd, "wb") as file:
            os.fchmod(file.fileno(), mode)  # mkstemp's 0600 would hide the file from others
            if isinstance(data, (bytes, bytearray, memoryview)):
                file.write(data)
            else:
                data(_OutputFile(file, shown))
            file.flush()
            os.fsync(file.fileno())
    except BaseException as error:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        if isinstance(error, OSError):
            raise _write_failed(shown, error) from None
        raise
    return temporary


def _write_failed(shown: StrPath, error: OSError) -> RunFailure:
    return RunFailure(f"{shown}: cannot write ({error.strerror or error}); the old file is "
                      "untouched")


class _OutputFile:
    """The temporary as a writer function sees it: a write that fails is at once the
    output's RunFailure. A writer often copies from a file open in `reading()` (an export
    streams the checkpoint), whose ladder turns any OSError in its body into "cannot
    read" that file; a full disk or a file-size limit (EFBIG) is the output's failure,
    not the input's."""

    def __init__(self, file: BinaryIO, shown: StrPath) -> None:
        self._file = file
        self._shown = shown

    def write(self, data: bytes | bytearray | memoryview) -> int:
        try:
            return self._file.write(data)
        except OSError as error:
            raise _write_failed(self._shown, error) from None

    def __getattr__(self, name: str) -> object:  # tell, fileno, flush: the file's own
        return getattr(self._file, name)


def _replace(temporary: str, target: Path, shown: StrPath) -> None:
    """Rename the temporary over the target; on a failure remove it (RunFailure)."""
    try:
        os.replace(temporary, target)
    except OSError as error:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise _write_failed(shown, error) from None


def _fsync_directory(directory: Path) -> None:
    # Makes the rename itself durable; some filesystems cannot open directories.
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # e.g. EINVAL where directories cannot be synced; the rename stands
    finally:
        os.close(fd)


@functools.lru_cache(maxsize=1)
def _umask() -> int:
    # os.umask can only be read by setting it; do it once.
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _file_mode(path: Path) -> int:
    """The mode a replacement keeps: the old file's, else what open() would give."""
    try:
        return path.stat().st_mode & 0o777
    except OSError:
        return 0o666 & ~_umask()


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", socket.gethostname())[:32] or "host"


def _temp_prefix(path: Path) -> str:
    # Hidden, and carrying host and pid so a later writer can tell a dead one's leftovers.
    return f".{path.name}.{_host()}.{os.getpid()}."


def _remove_stale_temporaries(path: Path) -> None:
    """Delete temporaries left by writers on this host that were killed mid-write."""
    pattern = re.compile(
        re.escape(f".{path.name}.{_host()}.") + r"(\d+)\.[^.]*" + re.escape(TEMP_SUFFIX))
    try:
        siblings = list(path.parent.iterdir())
    except OSError:
        return
    for sibling in siblings:
        match = pattern.fullmatch(sibling.name)
        if match and not _alive(int(match.group(1))):
            with contextlib.suppress(OSError):
                sibling.unlink()


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists but belongs to someone else
    return True

