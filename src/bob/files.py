"""Files Bob reads and writes: reads that fail with a one-line BadInput, outputs checked
before any work, atomic writes.

Ground floor: it imports only ``bob.errors``, so any layer may use it.

An atomic write goes to a temporary file in the target's directory, is flushed
and fsynced, renamed over the target, and the directory is fsynced, so a crash
at any moment leaves either the old file or the new one, never a mix. A failed
write removes its temporary and leaves the old file untouched.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import socket
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from bob.errors import BadInput, RunFailure

Writer = Callable[[BinaryIO], None]
StrPath = str | os.PathLike[str]

TEMP_SUFFIX = ".tmp"


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


def require_regular_file(path: StrPath, what: str = "file") -> None:
    """BadInput unless `path` is a regular file (or a link to one) or a directory (which
    open() then reports): a FIFO, socket or device is "not a regular file", found by stat
    without opening it."""
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
    file, and no directory stands in its place. `what` names the file in the message."""
    directory = _require_file_place(path, what)
    probe_directory(directory, f"{path}: cannot write the {what} in {directory}")


def probe_directory(directory: StrPath, failure: str) -> None:
    """Create and remove a file in `directory`: the only sure test that writing works there
    (permissions, read-only mounts, /proc and the like); BadInput `failure (reason)` if not."""
    try:
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".bob-probe-"):
            pass
    except OSError as error:
        raise BadInput(f"{failure} ({error.strerror or error})") from None


def _require_file_place(path: StrPath, what: str | None = None) -> Path:
    """`path`'s directory, after a BadInput unless it exists and no directory stands at
    `path`; `what`, when given, names the file in the message."""
    target = Path(path)
    directory = target.parent
    if not directory.is_dir():
        goes = f" (the {what} goes there)" if what else ""
        raise BadInput(f"{path}: directory {directory} does not exist{goes}")
    if target.is_dir():
        kind = f", not a {what} file" if what else ""
        raise BadInput(f"{path}: is a directory{kind}")
    return directory


def atomic_write(path: StrPath, data: bytes | Writer) -> None:
    """Replace `path` with `data` (bytes, or a function writing to a binary file).

    Raises BadInput when the target cannot be a file (missing directory, a
    directory in the way) and RunFailure when writing fails; in both cases the
    old file, if any, is untouched and no temporary is left.
    """
    path = Path(path)
    directory = _require_file_place(path)
    _remove_stale_temporaries(path)
    mode = _file_mode(path)
    try:
        fd, temporary = tempfile.mkstemp(
            prefix=_temp_prefix(path), suffix=TEMP_SUFFIX, dir=directory)
    except OSError as error:
        raise RunFailure(f"{path}: cannot write ({error.strerror or error})") from None
    try:
        with os.fdopen(fd, "wb") as file:
            os.fchmod(file.fileno(), mode)  # mkstemp's 0600 would hide the file from others
            if isinstance(data, (bytes, bytearray, memoryview)):
                file.write(data)
            else:
                data(file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException as error:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        if isinstance(error, OSError):
            raise RunFailure(
                f"{path}: cannot write ({error.strerror or error}); the old file is untouched"
            ) from None
        raise
    _fsync_directory(directory)


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

