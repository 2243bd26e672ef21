"""How a run's training data was given: what a checkpoint's segment records so that
`bob train --resume` can read the same data again when no data is named.

A segment's ``sources`` (JSON) holds:

    kind           "builtin" (the pydoc topics), "text", "tokens", "counts" or "input"
    paths          the files as the user gave them (a directory, a glob, a URL, "-")
    vocab          token files: their V
    token_dtype    raw token files: "uint16" or "uint32"
    val_fraction   the last fraction of the data held out as validation (--val-fraction)
    first_symbol   the data's first symbol where it was read from the data (generation
                   without a prompt starts a token model there)
    stream         true where the data came from a stream (standard input, a pipe, a
                   FIFO): read as it came, it cannot be read again

Only what was given is written. The data itself is not kept: its digest is the
segment's ``data_digest``, which `--resume` checks again before training on it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Integral, Real

KINDS = ("builtin", "text", "tokens", "counts", "input")
TOKEN_DTYPES = ("uint16", "uint32")
MAX_PATHS = 4096  # a segment names at most this many inputs (a directory is one)
MAX_PATH_CHARACTERS = 4096


@dataclass(frozen=True)
class DataSources:
    """The training data as it was given (the data's digest is the segment's)."""

    kind: str
    paths: tuple[str, ...] = ()
    vocab: int | None = None
    token_dtype: str | None = None
    val_fraction: float | None = None
    first_symbol: int | None = None
    stream: bool = False  # read as it came (stdin, a pipe, a FIFO): not again

    def __post_init__(self) -> None:
        object.__setattr__(self, "paths", tuple(self.paths))
        problem = self.problem()
        if problem:
            raise ValueError(problem)

    def problem(self) -> str | None:
        """What makes these sources unsound, or None."""
        if self.kind not in KINDS:
            return f"sources kind {self.kind!r} is not one of {', '.join(KINDS)}"
        if (self.kind == "builtin") == bool(self.paths) or len(self.paths) > MAX_PATHS:
            return f"sources of kind {self.kind!r} name {len(self.paths)} paths"
        if not all(isinstance(path, str) and 0 < len(path) <= MAX_PATH_CHARACTERS
                   for path in self.paths):
            return "a sources path is not a name of 1 to 4096 characters"
        if (self.vocab is not None) != (self.kind == "tokens") or (
                self.vocab is not None and not _whole(self.vocab, 2)):
            return f"sources vocab {self.vocab!r} does not fit kind {self.kind!r}"
        if (self.token_dtype is not None) != (self.kind == "tokens") or (
                self.token_dtype is not None and self.token_dtype not in TOKEN_DTYPES):
            return f"sources token_dtype {self.token_dtype!r} does not fit kind {self.kind!r}"
        if self.val_fraction is not None and not (
                isinstance(self.val_fraction, Real) and not isinstance(self.val_fraction, bool)
                and math.isfinite(self.val_fraction) and 0 < self.val_fraction < 1):
            return f"sources val_fraction {self.val_fraction!r} is not in (0, 1)"
        if self.first_symbol is not None and not _whole(self.first_symbol, 0):
            return f"sources first_symbol {self.first_symbol!r} is not a symbol"
        if not isinstance(self.stream, bool):
            return f"sources stream {self.stream!r} is not true or false"
        return None

    @property
    def rereadable(self) -> bool:
        """Whether the data can be read again: not a stream (standard input, a pipe)."""
        return not self.stream and "-" not in self.paths

    def describe(self) -> str:
        """The data as messages name it: its paths, or the built-in corpus."""
        if self.kind == "builtin":
            return "the built-in corpus"
        return ", ".join("stdin" if path == "-" else path for path in self.paths)

    def to_json(self) -> dict[str, object]:
        fields: dict[str, object] = {"kind": self.kind}
        for name in ("paths", "vocab", "token_dtype", "val_fraction", "first_symbol"):
            value = getattr(self, name)
            if value is not None and value != ():
                fields[name] = list(value) if name == "paths" else value
        if self.stream:
            fields["stream"] = True
        return fields

    @classmethod
    def from_json(cls, entry: object) -> DataSources | str:
        """Sources from their JSON object, or what is wrong with the object."""
        names = {"kind", "paths", "vocab", "token_dtype", "val_fraction", "first_symbol",
                 "stream"}
        if not isinstance(entry, dict) or "kind" not in entry or not set(entry) <= names:
            return f"sources {entry!r} is not an object of {', '.join(sorted(names))}"
        paths = entry.get("paths", [])
        if not isinstance(paths, list):
            return f"sources paths {paths!r} is not a list"
        try:
            return cls(entry["kind"], tuple(paths), entry.get("vocab"),
                       entry.get("token_dtype"), entry.get("val_fraction"),
                       entry.get("first_symbol"), entry.get("stream", False))
        except ValueError as error:
            return str(error)


def _whole(value: object, least: int) -> bool:
    return (isinstance(value, Integral) and not isinstance(value, bool) and least <= value
            <= 2**53)
