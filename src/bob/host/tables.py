"""How a run holds its tables: dense V x V, or collapsed (a rest class per row and the
columns the data names, `bob.records.collapsed`), chosen from the data.

Both give the same bytes (the dense program is the collapsed one's oracle); they differ
in what they cost. A dense table costs V x V cells whatever the data; a collapsed one
V + K classes (K: the cells the data names) plus, per row an update, its 256 lanes'
replay. The rule, `choose_tables`:

- V above MAX_DENSE_VOCAB: collapsed (no dense table of that size exists);
- otherwise collapsed where V >= COLLAPSE_FROM_VOCAB and the classes are at most
  1/CLASS_FRACTION of the dense cells, else dense.

`--tables dense|collapsed` forces one. A checkpoint of either kind starts a run of either
kind, converted exactly (`starting_tables`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from bob.config import CHECKPOINT_TENSORS, MAX_DENSE_VOCAB, TABLES_CHOICES, Tables, require_choice
from bob.errors import BadInput
from bob.records.binary import InputRecord
from bob.records.checkpoint import StartingPoint, TrainingState
from bob.records.collapsed import (
    MAX_EXCEPTIONS,
    ClassIndex,
    CollapsedCheckpoint,
    collapsed_from_rows,
)

# Below this V a dense row is a few hundred floats: its kernels keep it on chip, and the
# collapsed kernels' per-row replay of 256 lanes costs as much as the row itself.
COLLAPSE_FROM_VOCAB = 2048
# Collapsed where V + K is at most this fraction of V * V: far enough below dense that the
# per-class work and the lanes' replay cost less than streaming the dense tables.
CLASS_FRACTION = 16


@dataclass(frozen=True)
class TablesChoice:
    """The tables a run holds, and why (for the run's table and `--json`)."""

    tables: Tables
    reason: str


def choose_tables(asked: str, vocab: int, named: int) -> TablesChoice:
    """The layout for V and the K cells the data names (train and validation), as `asked`
    ("auto", "dense" or "collapsed"); BadInput where dense is asked for past its size."""
    require_choice("tables", asked, TABLES_CHOICES)
    cells = vocab * vocab
    if asked == "dense":
        if vocab > MAX_DENSE_VOCAB:
            raise BadInput(f"--tables dense: V={vocab} is past the largest dense table "
                           f"(V={MAX_DENSE_VOCAB}, {4 * cells / 2**30:.0f} GiB a table); "
                           "use --tables collapsed or auto")
        return TablesChoice("dense", "--tables dense")
    if vocab + named > MAX_EXCEPTIONS:
        raise BadInput(f"the data names {named} cells: more than the {MAX_EXCEPTIONS} "
                       "exception columns a collapsed table indexes")
    if asked == "collapsed":
        return TablesChoice("collapsed", "--tables collapsed")
    if vocab > MAX_DENSE_VOCAB:
        return TablesChoice("collapsed", f"V={vocab} is past the largest dense table "
                                         f"(V={MAX_DENSE_VOCAB})")
    share = f"{vocab + named:,} classes for {cells:,} dense cells"
    if vocab >= COLLAPSE_FROM_VOCAB and (vocab + named) * CLASS_FRACTION <= cells:
        return TablesChoice("collapsed", f"{share} (at most 1/{CLASS_FRACTION})")
    if vocab < COLLAPSE_FROM_VOCAB:
        return TablesChoice("dense", f"V={vocab} is below {COLLAPSE_FROM_VOCAB}: a dense row "
                                     "stays on chip")
    return TablesChoice("dense", f"{share} (more than 1/{CLASS_FRACTION})")


def named_keys(record: InputRecord, validation: InputRecord | None = None) -> np.ndarray:
    """The cells the data names (row * V + column, sorted, unique): the training record's
    targets or pairs, and the validation record's pairs."""
    parts = [record.named_keys()]
    if validation is not None:
        parts.append(validation.named_keys())
    return np.unique(np.concatenate(parts)) if len(parts) > 1 else parts[0]


def starting_tables(tables: Tables, state: TrainingState, named: np.ndarray,
                    stored=None) -> CollapsedCheckpoint | StartingPoint:
    """Where a run of `tables` starts, with `state`'s metadata: zero tables (no `stored`
    checkpoint), or `stored` (a dense file or sharded checkpoint, or a collapsed one)
    converted exactly to the run's layout. A collapsed start's exceptions are the cells
    `named` and the stored state's own (`CollapsedCheckpoint.reindexed`)."""
    if tables == "dense":  # a collapsed file delivers its rows expanded
        return StartingPoint(replace(state, tables="dense", exceptions=0), stored)
    collapsed_state = replace(state, tables="collapsed", exceptions=state.exceptions)
    if stored is None:
        return CollapsedCheckpoint.zeros(collapsed_state, ClassIndex.from_keys(state.vocab,
                                                                               named))
    if stored.state.tables == "collapsed":
        return stored.with_state(collapsed_state).reindexed(named)
    return collapsed_from_rows(collapsed_state, lambda first, last: tuple(
        stored.row_block(name, first, last) for name in CHECKPOINT_TENSORS), named)

