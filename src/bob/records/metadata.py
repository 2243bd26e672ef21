"""The string metadata of Bob's safetensors files (checkpoints, counts files).

Each reader raises BadInput "<file>: <problem>" naming the first field that is
not sound, so both files refuse a bad field in the same words.
"""

from __future__ import annotations

import importlib.metadata
import re
from collections.abc import Iterable

from bob.config import DISTRIBUTION
from bob.errors import BadInput

PLAIN_INTEGER = re.compile(r"0|[1-9][0-9]*")  # plain decimal: no sign, spaces or underscores
# The largest integer a field may hold: every integer up to it is exact as a float64, so
# a step or count survives the float arithmetic (bias correction, rates) that uses it.
MAX_INTEGER = 1 << 53


def bob_version() -> str:
    """This Bob's version, for a file's created_by field."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def require_fields(metadata: dict[str, str], source: str, *, kind: str, format_name: str,
                   required: Iterable[str], hint: str = "") -> None:
    """The metadata names `format_name` as its format and holds every required field.

    `kind` names the file in the refusal ("checkpoint"); `hint`, where given, follows
    the expected format and says how to make such a file.
    """
    if metadata.get("format") != format_name:
        found = f"format {metadata['format']!r}" if "format" in metadata else "no format field"
        raise BadInput(f"{source}: not a Bob {kind} ({found} in the metadata, expected "
                       f"{format_name!r}{hint})")
    for name in required:
        if name not in metadata:
            raise BadInput(f"{source}: metadata field {name!r} is missing")


def read_integers(metadata: dict[str, str], names: Iterable[str],
                  source: str) -> dict[str, int]:
    """Each named field as an integer in [0, 2**53] written in plain decimal."""
    integers = {}
    for name in names:
        text = metadata[name]
        if not PLAIN_INTEGER.fullmatch(text):
            raise BadInput(f"{source}: metadata {name} {text!r} is not a "
                           f"non-negative integer")
        # The length first: int() of thousands of digits is refused, or slow.
        if len(text) > len(str(MAX_INTEGER)) or int(text) > MAX_INTEGER:
            shown = text if len(text) <= 24 else f"{text[:12]}... ({len(text)} digits)"
            raise BadInput(f"{source}: metadata {name} {shown} is above 2**53 "
                           f"= {MAX_INTEGER}, the largest Bob reads")
        integers[name] = int(text)
    return integers


def read_number(metadata: dict[str, str], name: str, source: str) -> float:
    """One field as a float (repr() of one round-trips)."""
    try:
        return float(metadata[name])
    except ValueError:
        raise BadInput(f"{source}: metadata {name} {metadata[name]!r} is not a "
                       f"number") from None
