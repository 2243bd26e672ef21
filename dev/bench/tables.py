"""Rows, tables and the report of ``bob bench``: what was measured, ready to print or save.

Nothing here measures; ``dev.bench.measurement`` and ``dev.bench.suite`` fill these.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from bob.config import HYPER_FIELDS, Hyper, Mode

Device = Literal["cpu", "cuda"]
RowKind = Literal["bob", "host", "peer", "floor"]
DEVICES: tuple[Device, ...] = ("cpu", "cuda")
Against = Literal["run", "invocation", "command"]

BYTES_PER_PARAMETER = 24  # read + write of W, m, v: the least an AdamW update moves
# Bandwidth is shown from this V on: smaller tables live in the caches (an H200's
# L2 holds 60 MB, so V = 1024's 12 MB of state never leaves it).
BANDWIDTH_MIN_VOCAB = 2048
TARGET_SEED = 0  # the random targets (or random corpus) every contender trains on
COMMAND_ROW = "train command"  # Bob's whole `bob train` process: "bob cuda train command"


@dataclass(frozen=True)
class Row:
    """One contender (or one piece of Bob's host work) at one V."""

    contender: str
    kind: RowKind
    updates: int  # N: updates per timing
    seconds: float | None = None  # median seconds of one timing (None: skipped or failed)
    samples: tuple[float, ...] = ()  # every timing, in order
    loss: float | None = None  # the objective after N updates from the zero table
    note: str = ""
    error: str | None = None  # "skipped: ..." or "failed: ..."
    # A whole process timed from start to exit (a command row): the ratio column "vs bob
    # command" compares such rows with each other.
    whole_process: bool = False
    peak_rss_bytes: int | None = None  # a whole process's peak resident memory

    @property
    def us_per_update(self) -> float | None:
        if self.seconds is None:
            return None
        return self.seconds / self.updates * 1e6

    @property
    def spread(self) -> float | None:
        """(slowest - fastest) / median of the timings."""
        if self.seconds is None or len(self.samples) < 2 or self.seconds <= 0:
            return None
        return (max(self.samples) - min(self.samples)) / self.seconds


@dataclass(frozen=True)
class BenchTable:
    """Every contender on one device at one V."""

    device: Device
    device_name: str
    vocab: int
    updates: int
    repeats: int
    rows: tuple[Row, ...]
    mode: Mode = "hard"  # the objective every contender trains
    pairs: int = 0  # K, corpus mode: the distinct pairs of the corpus
    data: str = ""  # where the targets or the corpus come from

    @property
    def parameters(self) -> int:
        return self.vocab * self.vocab

    @property
    def shows_bandwidth(self) -> bool:
        return self.vocab >= BANDWIDTH_MIN_VOCAB

    def bandwidth(self, row: Row) -> float | None:
        """Bytes/s at 24 bytes per parameter per update."""
        us = row.us_per_update
        if row.kind == "host" or us is None or us <= 0:
            return None
        return BYTES_PER_PARAMETER * self.parameters / (us * 1e-6)

    def _bob(self, against: Against) -> Row | None:
        name = f"bob {self.device} {COMMAND_ROW if against == 'command' else against}"
        return next((r for r in self.rows if r.contender == name and r.seconds), None)

    def ratio(self, row: Row, against: Against) -> float | None:
        """This row's time over Bob's run, whole invocation or whole `bob train` command
        (only whole processes against the command): > 1 means Bob is faster."""
        bob = self._bob(against)
        if bob is None or row.kind == "host" or row.us_per_update is None:
            return None
        if against == "command" and not row.whole_process:
            return None
        assert bob.us_per_update is not None
        return row.us_per_update / bob.us_per_update

    @property
    def shows_commands(self) -> bool:
        """Whether whole processes stand side by side (a "vs bob command" column)."""
        return sum(1 for row in self.rows if row.whole_process) > 1

    @property
    def shows_memory(self) -> bool:
        return any(row.peak_rss_bytes is not None for row in self.rows)

    @property
    def bob_failed(self) -> bool:
        return any(r.kind == "bob" and r.error and r.error.startswith("failed")
                   for r in self.rows)

    def to_json(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "device_name": self.device_name,
            "vocab": self.vocab,
            "updates": self.updates,
            "repeats": self.repeats,
            "mode": self.mode,
            "pairs": self.pairs,
            "data": self.data,
            "rows": [self.row_json(row) for row in self.rows],
        }

    def row_json(self, row: Row) -> dict[str, Any]:
        bandwidth = self.bandwidth(row)
        return {
            "contender": row.contender,
            "kind": row.kind,
            "updates": row.updates,
            "seconds": row.seconds,
            "samples": list(row.samples),
            "us_per_update": row.us_per_update,
            "spread": row.spread,
            "gb_per_s": None if bandwidth is None else bandwidth / 1e9,
            "ratio_to_bob_run": self.ratio(row, "run"),
            "ratio_to_bob_invocation": self.ratio(row, "invocation"),
            "ratio_to_bob_command": self.ratio(row, "command"),
            "loss": row.loss,
            "note": row.note,
            "error": row.error,
            "whole_process": row.whole_process,
            "peak_rss_bytes": row.peak_rss_bytes,
        }


@dataclass(frozen=True)
class BenchReport:
    tables: tuple[BenchTable, ...]
    hyper: Hyper
    date: str  # UTC, ISO 8601
    command: str
    environment: dict[str, str] = field(default_factory=dict)

    @property
    def bob_failed(self) -> bool:
        return any(table.bob_failed for table in self.tables)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": "bob-bench",
            "format_version": 2,
            "date": self.date,
            "command": self.command,
            "bytes_per_parameter": BYTES_PER_PARAMETER,
            # AdamW's five (the benches run no learning-rate schedule)
            "hyper": {name: getattr(self.hyper, name) for name in HYPER_FIELDS},
            "target_seed": TARGET_SEED,
            "environment": self.environment,
            "tables": [table.to_json() for table in self.tables],
        }

