"""Where a corpus comes from: inputs resolved to files, and files cut into pieces.

An input is a file, a directory (its files, recursively, in sorted order), a
glob pattern, ``-`` for standard input, a stream (a pipe such as bash's
``<(zcat x.gz)``, a FIFO, a character device), or an fsspec URL
(``s3://bucket/x``, ``memory://x``, ``file:///x``; any protocol whose fsspec
package is installed). Each file is a sequence of tokens: bytes for text, or
little-endian uint16/uint32 for token files (nanoGPT's ``train.bin``), or a
``.npy`` array of integers (from a regular file: its header gives its length).
A raw token file's type is the caller's (`token_dtype`): uint16 holds the ids of
vocabularies up to 65536 (nanoGPT's), uint32 those of larger ones (up to 2^20).

A directory's or a glob's entries are regular files (or links to them) and
directories; anything else among them (a broken link, a FIFO, a socket, a
device) is refused by name, never skipped. A stream has no size up front: it is
counted as it comes, a block at a time, up to STREAM_MAX_BYTES.

A piece is a range [start, stop) of one file's tokens. It counts the pairs
(t[i], t[i+1]) for start <= i < stop with i + 1 inside the file, so it reads
one token past its end. Any partition of a file into pieces therefore counts
each adjacent pair exactly once, and no pair crosses a file boundary.
"""

from __future__ import annotations

import contextlib
import glob
import math
import os
import stat
import sys
import tokenize
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import BinaryIO

import numpy as np

from bob.errors import BadInput, reason_of
from bob.files import (
    reading_input,
    require_named,
    require_regular_file,
    special_kind,
    stream_kind,
    stream_too_long,
    unreadable,
)

STDIN = "-"
# The most Bob counts from one stream (standard input, a pipe, a device). Counting holds a
# block at a time, so the bound is there only so an endless stream (/dev/zero) ends: 64 GiB
# is about three minutes of counting bytes; a larger corpus is counted from a file.
STREAM_MAX_BYTES = 1 << 36
STREAM_BOUND = "the most Bob counts from a stream (standard input, a pipe, a device); count " \
               "a larger corpus from a file"
TOKEN_DTYPES = {"uint16": "<u2", "uint32": "<u4"}  # raw token files: nanoGPT writes uint16
UINT16_MAX_VOCAB = 1 << 16  # ids of a larger vocabulary do not fit 16 bits
# .npy tokens: integers, little-endian (or single bytes)
_NPY_DTYPES = frozenset(("|u1", "<u2", "<u4", "<u8", "|i1", "<i2", "<i4", "<i8"))
_GLOB_CHARACTERS = frozenset("*?[")


@dataclass(frozen=True)
class Source:
    """One file of tokens: where it is, how its tokens are stored, how many there are."""

    name: str  # as the user gave or a directory/glob produced it; a URL keeps its protocol
    size: int  # bytes of the whole file; -1 for a stream (standard input, a pipe, a device)
    dtype: str = "|u1"  # NumPy dtype string of one token: "|u1" for text
    offset: int = 0  # bytes before the first token (a .npy header)
    explicit: bool = True  # named by the user, not found in a directory or by a glob

    @property
    def itemsize(self) -> int:
        return np.dtype(self.dtype).itemsize

    @property
    def tokens(self) -> int:
        return (self.size - self.offset) // self.itemsize

    @property
    def is_url(self) -> bool:
        return "://" in self.name

    @property
    def is_stdin(self) -> bool:
        return self.name == STDIN

    @property
    def is_stream(self) -> bool:
        """Read through once as it comes, its size known only at its end."""
        return self.size < 0


@dataclass(frozen=True)
class Piece:
    """Tokens [start, stop) of one source; it counts the pairs that start there."""

    source: Source
    start: int
    stop: int

    @property
    def bytes(self) -> int:
        return (self.stop - self.start) * self.source.itemsize

    def __str__(self) -> str:
        size = self.source.itemsize
        first = self.source.offset + self.start * size
        return f"{self.source.name} bytes {first}-{first + self.bytes}"


# -- the type of a raw token ---------------------------------------------------------
def token_dtype(vocab: int, given: str | None = None) -> str:
    """The type raw token files of V are read as: `given` (a TOKEN_DTYPES name), else the
    narrowest that holds every id, uint16 up to V = 65536 (nanoGPT's train.bin) and
    uint32 above.

    A given uint16 with V above 65536 is refused in one line: such a file cannot hold
    this vocabulary's ids (a writer that narrowed them to 16 bits lost their high bits),
    and a uint32 file read as uint16 would yield only ids below V, so nothing later
    would notice.
    """
    if given is None:
        return "uint16" if vocab <= UINT16_MAX_VOCAB else "uint32"
    if given not in TOKEN_DTYPES:
        raise BadInput(f"--token-dtype must be one of {', '.join(TOKEN_DTYPES)}, not "
                       f"{given!r}")
    if given == "uint16" and vocab > UINT16_MAX_VOCAB:
        raise BadInput(f"--token-dtype uint16 holds ids below {UINT16_MAX_VOCAB}, and "
                       f"V={vocab} has ids up to {vocab - 1}: write the tokens as uint32 "
                       "(read so by default above V=65536)")
    return given


# -- resolving inputs ------------------------------------------------------------
def _fsspec():
    try:
        import fsspec
    except ImportError:
        raise BadInput("reading URLs needs fsspec: pip install 'bob-bigram[remote]'") from None
    return fsspec


def _url_files(url: str) -> list[tuple[str, int, bool]]:
    """(url, size, explicit) of a URL's files: a file, a directory's tree or a glob."""
    fsspec = _fsspec()
    try:
        fs, path = fsspec.core.url_to_fs(url)
    except (ImportError, ValueError) as error:
        raise BadInput(f"{url}: cannot open this URL ({error})") from None
    protocol = url.split("://", 1)[0]

    def full(p: str) -> str:
        return fs.unstrip_protocol(p) if protocol != "file" else f"file://{p}"

    try:
        if any(c in path for c in _GLOB_CHARACTERS) and not fs.exists(path):
            found = sorted(p for p in fs.glob(path) if fs.isfile(p))
            if not found:
                raise BadInput(f"{url}: no file matches")
            return [(full(p), int(fs.size(p)), False) for p in found]
        if fs.isdir(path):
            found = sorted(fs.find(path))
            if not found:
                raise BadInput(f"{url}: directory has no files")
            return [(full(p), int(fs.size(p)), False) for p in found]
        if not fs.exists(path):
            raise BadInput(f"{url}: no such file")
        return [(url, int(fs.size(path)), True)]
    except OSError as error:
        raise BadInput(f"{url}: cannot read ({error.strerror or error})") from None


def _local_files(name: str) -> list[tuple[str, int, bool]]:
    path = Path(name)
    if path.is_dir():
        found = _entry_files(sorted(path.rglob("*")), name)
        if not found:
            raise BadInput(f"{name}: directory has no files")
        return [(p, os.path.getsize(p), False) for p in found]
    if any(c in name for c in _GLOB_CHARACTERS) and not path.exists():
        found = _entry_files(sorted(map(Path, glob.glob(name, recursive=True))), name)
        if not found:
            raise BadInput(f"{name}: no file matches")
        return [(p, os.path.getsize(p), False) for p in found]
    if stream_kind(name) is not None:
        return [(name, -1, True)]
    require_regular_file(name, "corpus file")  # a socket or a block device
    try:
        return [(name, os.stat(name).st_size, True)]
    except FileNotFoundError:
        raise BadInput(f"{name}: no such file") from None
    except OSError as error:
        raise BadInput(f"{name}: cannot read ({error.strerror or error})") from None


def _entry_files(entries: Sequence[Path], where: str) -> list[str]:
    """The regular files among a directory's or a glob's entries; BadInput naming the first
    entry that is neither a file nor a directory (a broken link, a FIFO, a socket, a
    device): left out, it would leave its data out of the count unsaid."""
    found = []
    for entry in entries:
        try:
            mode = entry.stat().st_mode
        except FileNotFoundError:
            if entry.is_symlink():
                raise BadInput(f"{entry}: a broken symbolic link (to {os.readlink(entry)}) "
                               f"in {where}") from None
            raise BadInput(f"{entry}: vanished while {where} was listed") from None
        except OSError as error:
            raise BadInput(f"{entry}: cannot read ({error.strerror or error})") from None
        if stat.S_ISREG(mode):
            found.append(str(entry))
        elif not stat.S_ISDIR(mode):
            raise BadInput(f"{entry}: not a regular file ({special_kind(mode)}) in {where}; "
                           "a directory or glob holds only files to count")
    return found


def _token_layout(name: str, size: int, dtype: str) -> tuple[str, int]:
    """(dtype, header bytes) of a token file: raw tokens of `dtype`, or a .npy array."""
    if name.endswith(".npy"):
        if size < 0:
            raise BadInput(f"{name}: a .npy file is read from a regular file (its header "
                           "gives its length), not from a stream; pipe raw tokens instead")
        return _npy_layout(name)
    itemsize = np.dtype(dtype).itemsize
    if size >= 0 and size % itemsize:
        raise BadInput(f"{name}: {size} bytes is not a whole number of "
                       f"{itemsize}-byte tokens (is --token-dtype right?)")
    return dtype, 0


# What NumPy's header reader raises on a header nobody here wrote, besides ValueError: a
# literal it cannot tokenize, one nested past the parser's depth, a value it cannot hold.
_NPY_HEADER_ERRORS = (ValueError, SyntaxError, tokenize.TokenError, TypeError, RecursionError,
                      MemoryError, OverflowError, UnicodeDecodeError)


def _npy_layout(name: str) -> tuple[str, int]:
    with open_binary(name) as file:
        try:
            version = np.lib.format.read_magic(file)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(file)
            else:
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(file)
        except _NPY_HEADER_ERRORS as error:
            # NumPy's text may run to several lines and quote the whole header.
            raise BadInput(f"{name}: not a readable .npy file ({reason_of(error)})") from None
        offset = file.tell()
    if dtype.str not in _NPY_DTYPES:
        raise BadInput(f"{name}: .npy of {dtype}, not little-endian integers")
    if fortran and len(shape) > 1:
        raise BadInput(f"{name}: .npy in Fortran order; tokens are read in C order")
    if any(length < 0 for length in shape):
        raise BadInput(f"{name}: .npy shape {_shape_text(shape)} has a negative length")
    # In Python's integers: a product of huge lengths must not wrap around in int64.
    expected = offset + math.prod(shape) * dtype.itemsize
    size = _size_of(name)
    if size != expected:
        raise BadInput(f"{name}: {size} bytes, its .npy header says {expected}")
    return dtype.str, offset


def _shape_text(shape: tuple[int, ...]) -> str:
    """A shape as a refusal names it: in full when short, else its first lengths."""
    text = str(shape)
    return text if len(text) <= 60 else f"{text[:57]}... ({len(shape)} dimensions)"


def _size_of(name: str) -> int:
    if "://" in name:
        fs, path = _fsspec().core.url_to_fs(name)
        return int(fs.size(path))
    return os.path.getsize(name)


def resolve(inputs: Sequence[str], token_dtype: str | None = None) -> tuple[Source, ...]:
    """The files of the inputs, in order; a directory's files sorted; BadInput naming a bad one.

    `token_dtype` None reads the files as bytes (text), else as tokens of that
    type ("uint16"/"uint32"; ".npy" files carry their own).
    """
    if not inputs:
        raise BadInput("give at least one input (a file, directory, glob, URL or -)")
    if sum(1 for name in inputs if name == STDIN) > 1:
        raise BadInput("-: standard input can be read only once")
    sources = []
    for name in inputs:
        require_named(name, "corpus file")  # else pathlib would count the current directory
        if name == STDIN:
            dtype = "|u1" if token_dtype is None else TOKEN_DTYPES[token_dtype]
            sources.append(Source(STDIN, -1, dtype))
            continue
        files = _url_files(name) if "://" in name else _local_files(name)
        if files[0][1] < 0 and sum(1 for other in inputs if other == name) > 1:
            # A second open would wait for a writer that has gone.
            raise BadInput(f"{name}: a stream ({stream_kind(name)}) can be read only once")
        for file_name, size, explicit in files:
            dtype, offset = "|u1", 0
            if token_dtype is not None:
                dtype, offset = _token_layout(file_name, size, TOKEN_DTYPES[token_dtype])
            sources.append(Source(file_name, size, dtype, offset, explicit))
    return tuple(sources)


def local_files(inputs: Sequence[str]) -> list[str]:
    """The local files these inputs name, as far as they can be listed (a directory's, a
    glob's, a file itself): what an output must not be, lest writing it destroy the
    data. Standard input and URLs name none here; an input that cannot be listed names
    itself (`resolve` refuses it in its turn)."""
    found = []
    for name in inputs:
        if not name or name == STDIN or "://" in name:
            continue
        try:
            found.extend(file for file, _, _ in _local_files(name))
        except BadInput:
            found.append(name)
    return found


# -- reading -----------------------------------------------------------------------
def open_binary(name: str) -> BinaryIO:
    """The file for reading bytes: a local path directly, a URL through fsspec."""
    try:
        if "://" in name:
            return _fsspec().open(name, "rb").open()
        return open(name, "rb")  # noqa: SIM115  # the caller closes it
    except OSError as error:
        raise unreadable(name, error) from None


def read_blocks(piece: Piece, block_tokens: int) -> Iterator[np.ndarray]:
    """The piece's tokens and the one after it, in blocks of at most block_tokens.

    Consecutive blocks do not overlap: the caller carries the last token of a
    block over to the next, so the pair across the cut is counted once.
    """
    source = piece.source
    size = source.itemsize
    end = min(piece.stop + 1, source.tokens)  # one past: the pair that starts at stop-1
    buffer = bytearray(block_tokens * size)
    view = memoryview(buffer)
    with open_binary(source.name) as file:
        try:
            file.seek(source.offset + piece.start * size)
            position = piece.start
            while position < end:
                want = min(block_tokens, end - position) * size
                got = _read_into(file, view[:want])
                if got < want:
                    raise BadInput(f"{source.name}: ended early at byte "
                                   f"{source.offset + position * size + got} (it changed "
                                   f"while being read?)")
                yield np.frombuffer(buffer, source.dtype, want // size)
                position += want // size
        except OSError as error:
            raise BadInput(f"{source.name}: cannot read the file "
                           f"({error.strerror or error})") from None


def _read_into(file: BinaryIO, view: memoryview) -> int:
    """Fill view from the file (several reads where a file system returns less)."""
    done = 0
    while done < len(view):
        readinto = getattr(file, "readinto", None)
        if readinto is not None:
            got = readinto(view[done:])
        else:
            data = file.read(len(view) - done)
            got = len(data)
            view[done:done + got] = data
        if not got:
            break
        done += got
    return done


def stream_blocks(source: Source, block_bytes: int) -> Iterator[np.ndarray]:
    """A stream (standard input, a pipe, a device) in blocks of whole tokens, as it comes;
    a partial last token is refused, and so is a stream past STREAM_MAX_BYTES."""
    size = source.itemsize
    seen = 0
    rest = b""
    with _opened_stream(source) as stream:
        while chunk := stream.read(block_bytes):
            seen += len(chunk)
            if seen > STREAM_MAX_BYTES:
                raise stream_too_long(source.name, STREAM_MAX_BYTES, STREAM_BOUND)
            data = rest + chunk
            whole = len(data) - len(data) % size
            rest = data[whole:]
            if whole:
                yield np.frombuffer(data[:whole], source.dtype)
    if rest:
        raise BadInput(f"{source.name}: ends with {len(rest)} bytes of a {size}-byte token")


@contextlib.contextmanager
def _opened_stream(source: Source) -> Iterator[BinaryIO]:
    if source.is_stdin:
        yield sys.stdin.buffer
        return
    with reading_input(source.name, "corpus file") as stream:
        yield stream


def split_tail(sources: Sequence[Source], fraction: float,
               ) -> tuple[tuple[Source, ...], tuple[Source, ...]]:
    """The sources' tokens cut where the last `fraction` of all of them begins (at
    int(total * (1 - fraction)), as nanoGPT's prepare scripts cut 90/10): the sources
    before the cut and those after it, a file the cut falls in as one piece on each side
    (the same file, its tokens counted from another offset or to another end), so no pair
    crosses the cut, as none crosses a file boundary."""
    for source in sources:
        if source.is_stream:
            raise BadInput(f"{source.name}: --val-fraction cuts the data where its last part "
                           "begins, and a stream's length is known only at its end; give a "
                           "file")
    total = sum(source.tokens for source in sources)
    cut = int(total * (1.0 - fraction))
    before: list[Source] = []
    after: list[Source] = []
    first = 0  # tokens in the sources before this one
    for source in sources:
        here = min(max(cut - first, 0), source.tokens)  # this source's tokens before the cut
        if here:
            before.append(replace(source, size=source.offset + here * source.itemsize))
        if here < source.tokens:
            after.append(replace(source, offset=source.offset + here * source.itemsize))
        first += source.tokens
    return tuple(before), tuple(after)


def first_token(source: Source) -> int | None:
    """The source's first token, read again (None for a stream or an empty file)."""
    if source.is_stream or source.tokens == 0:
        return None
    with open_binary(source.name) as file:
        file.seek(source.offset)
        data = file.read(source.itemsize)
    if len(data) < source.itemsize:
        return None
    return int(np.frombuffer(data, source.dtype)[0])


def split(sources: Sequence[Source], piece_tokens: int) -> list[Piece]:
    """Every file's tokens cut into pieces of at most piece_tokens (a file's own when smaller)."""
    if piece_tokens < 1:
        raise ValueError("a piece has at least one token")
    pieces = []
    for source in sources:
        if source.is_stream:
            raise ValueError("a stream cannot be cut into pieces")
        for start in range(0, source.tokens, piece_tokens):
            pieces.append(Piece(source, start, min(start + piece_tokens, source.tokens)))
    return pieces
