"""Bob's own gather, scatter and health check of the collapsed tables
(bob.kernels.own.collapsed_io): on the emulator against the collapsed reference, byte for
byte, over sound class indices (bob.records.collapsed.ClassIndex); their schedules
checked, their instructions printed as nvdisasm prints them, and each region through
own_regions' checks."""

from __future__ import annotations

import numpy as np
import pytest

from bob.config import MAX_VOCAB
from bob.isa import table
from bob.isa.check import check
from bob.kernels import own
from bob.kernels import reference as ref
from bob.kernels import signatures as sig
from bob.kernels.collapsed.reference import RowClasses, scatter_classes
from bob.kernels.own_regions import OWN_REGIONS, coverage_refusal, own_region
from bob.plan.placement import SM86, SM90
from bob.records.collapsed import ClassIndex
from isa_support import assert_printed_as_nvdisasm_prints
from own_support import code_order, run_region  # noqa: F401 - the fixture

ARCHS = ("sm_90", "sm_86")
# Every test on the code in each ordering of its straight runs (bob.isa.builder).
pytestmark = pytest.mark.usefixtures("code_order")
LANES = 256
REGIONS = (sig.COLLAPSED_GATHER, sig.COLLAPSED_SCATTER, sig.COLLAPSED_HEALTH)
SENTINEL = 0xA5A5A5A5  # what a slot holds that a kernel must not write
NAN_BITS = 0x7FFFFFFF


def _index(vocab: int, keys) -> ClassIndex:
    index = ClassIndex.from_keys(vocab, np.unique(np.asarray(keys, np.int64)))
    assert index.problem() is None
    return index


def _index_arguments(index: ClassIndex) -> dict:
    """The index's arrays and sizes as a collapsed launch passes them (an empty array
    stands for K = 0: one word nothing reads)."""
    columns = index.columns if index.exceptions else np.zeros(1, np.uint32)
    order = index.lane_order() if index.exceptions else np.zeros(1, np.uint32)
    return dict(row_offsets=index.device_offsets(), columns=columns, lane_order=order,
                vocab=index.vocab, exceptions=index.exceptions, classes=index.classes,
                offsets=index.vocab + 1)


def _classes(rng, index: ClassIndex) -> np.ndarray:
    """Class values with NaNs of several payloads (their bits must travel), +-inf, -0
    and subnormals planted."""
    values = (rng.standard_normal(index.classes) * 3).astype(np.float32).view(np.uint32)
    planted = np.array([0x7FC00001, 0xFFFFFFFF, 0x7F800001, 0x7F800000, 0xFF800000,
                        0x80000000, 0x00000001, 0x807FFFFF], np.uint32)
    where = rng.choice(index.classes, min(index.classes, 3 * len(planted)), replace=False)
    values[where] = np.resize(planted, len(where))
    return values.view(np.float32)


# -- the gather -----------------------------------------------------------------------------


def _gather_index(vocab: int) -> ClassIndex:
    """Row 0 with no exceptions, row 1 with more than 256 (most of its columns), row 2
    with every column an exception, a few rows with a few, the last row with some."""
    rng = np.random.default_rng(vocab)
    keys = [vocab + c for c in rng.choice(vocab, vocab - 19, replace=False)]
    keys += [2 * vocab + c for c in range(vocab)]
    for row in (3, 7, vocab // 2):
        keys += [row * vocab + c for c in rng.choice(vocab, 5, replace=False)]
    keys += [(vocab - 1) * vocab + c for c in (0, 1, 2 * vocab // 3, vocab - 1)]
    return _index(vocab, keys)


def _gather(arch: str, index: ClassIndex, classes: np.ndarray, prompt: int) -> np.ndarray:
    logits = np.full(index.vocab, SENTINEL, np.uint32).view(np.float32)
    out = run_region(own.image(sig.COLLAPSED_GATHER, arch), sig.COLLAPSED_GATHER, 1,
                     dict(logits=logits, prompt=np.array([prompt], np.uint32),
                          parameters=classes, **_index_arguments(index)))
    return out["logits"].view(np.uint32)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("vocab", [300, 37])
def test_the_gather_expands_every_kind_of_row(arch, vocab):
    index = _gather_index(vocab)
    counts = index.counts()
    assert counts[0] == 0 and counts[2] == vocab and counts[vocab - 1] == 4
    assert vocab < LANES or counts[1] > LANES
    classes = _classes(np.random.default_rng(1), index)
    reference = RowClasses.of(vocab, index.offsets, index.columns)
    for prompt in (0, 1, 2, 3, vocab // 2, vocab - 1):
        want = reference.expand(classes, np.array([prompt]))[0].view(np.uint32)
        got = _gather(arch, index, classes, prompt)
        assert (got == want).all(), (prompt, np.flatnonzero(got != want)[:5])


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("prompt", [300, 301, 0xFFFFFFFF])
def test_a_prompt_past_the_vocabulary_gathers_canonical_nans(arch, prompt):
    index = _gather_index(300)
    got = _gather(arch, index, _classes(np.random.default_rng(2), index), prompt)
    assert (got == NAN_BITS).all()


def test_the_gather_of_an_index_with_no_exceptions_is_the_rest():
    index = ClassIndex.empty(40)
    classes = _classes(np.random.default_rng(3), index)
    got = _gather("sm_90", index, classes, 39)
    assert (got == classes.view(np.uint32)[39]).all()


# -- the scatter ----------------------------------------------------------------------------


def _scatter(arch: str, index: ClassIndex, keys: np.ndarray, values: np.ndarray,
             grid: int) -> np.ndarray:
    weights = np.full(max(index.exceptions, 1), SENTINEL, np.uint32).view(np.float32)
    out = run_region(own.image(sig.COLLAPSED_SCATTER, arch), sig.COLLAPSED_SCATTER, grid,
                     dict(weights=weights, keys=np.asarray(keys, np.uint64), values=values,
                          count=len(keys), **_index_arguments(index)))
    return out["weights"].view(np.uint32)


def _scatter_reference(index: ClassIndex, keys: np.ndarray, values: np.ndarray) -> np.ndarray:
    weights = np.full(max(index.exceptions, 1), SENTINEL, np.uint32).view(np.float32)
    scatter_classes(RowClasses.of(index.vocab, index.offsets, index.columns),
                    np.asarray(keys, np.uint64), values, weights[:index.exceptions])
    return weights.view(np.uint32)


def _values(rng, count: int) -> np.ndarray:
    """Distinct bits per pair (a slot written from the wrong pair shows), a NaN's payload
    among them."""
    values = rng.permutation(count).astype(np.uint32) + np.uint32(0x3F000000)
    values[0] = 0x7FC00003
    return values.view(np.float32)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("grid", [1, 2])
def test_the_scatter_writes_exactly_the_exceptions_keys(arch, grid):
    """Keys that are exceptions, keys that are not (in rows with exceptions and in rows
    with none), keys of rows >= V (from V x V up to 2^64 - 1, and some whose low word is
    a cell's); more pairs than the grid's lanes: several grid-stride rounds."""
    vocab = 61
    rng = np.random.default_rng(grid)
    cells = vocab * vocab
    exceptions = rng.choice(np.arange(vocab, cells), 900, replace=False)  # row 0: none
    index = _index(vocab, exceptions)
    assert index.counts()[0] == 0 and (index.counts()[1:] > 0).any()
    hits = rng.choice(index.keys(), 700, replace=False)
    misses = np.setdiff1d(np.arange(cells), index.keys())
    misses = rng.choice(misses, 500, replace=False)
    assert (misses < vocab).any()  # row 0's
    outside = np.array([cells, cells + 1, 2 * cells, 2**32 - 1, 2**32, 2**32 + 5,
                        2**32 + 64, 2**63, 2**64 - 1], np.uint64)
    keys = np.concatenate([hits.astype(np.uint64), misses.astype(np.uint64), outside])
    keys = keys[rng.permutation(len(keys))]
    assert len(keys) > 2 * grid * LANES
    values = _values(rng, len(keys))
    want = _scatter_reference(index, keys, values)
    got = _scatter(arch, index, keys, values, grid)
    assert (got == want).all(), np.flatnonzero(got != want)[:5]
    assert (got != SENTINEL).sum() == len(hits)


@pytest.mark.parametrize("arch", ARCHS)
def test_the_scatter_searches_full_and_long_rows(arch):
    """A row whose every column is an exception, one with all but one (the search's
    longest ranges: bit_length(V) rounds needed), and pairs on every column of both."""
    vocab = 700
    rng = np.random.default_rng(7)
    full = [3 * vocab + c for c in range(vocab)]
    gap = int(rng.integers(vocab))
    almost = [5 * vocab + c for c in range(vocab) if c != gap]
    index = _index(vocab, full + almost + [vocab * vocab - 1])
    keys = np.array(full + [5 * vocab + c for c in range(vocab)], np.uint64)
    keys = keys[rng.permutation(keys.size)]
    values = _values(rng, keys.size)
    want = _scatter_reference(index, keys, values)
    got = _scatter(arch, index, keys, values, 3)
    assert (got == want).all(), np.flatnonzero(got != want)[:5]
    assert (got[:-1] != SENTINEL).all() and got[-1] == SENTINEL


@pytest.mark.parametrize("arch", ARCHS)
def test_the_scatter_of_no_pairs_or_into_no_exceptions_writes_nothing(arch):
    index = _index(50, [7, 60, 2499])
    assert (_scatter(arch, index, np.zeros(0, np.uint64), np.zeros(0, np.float32), 1)
            == SENTINEL).all()
    keys = np.arange(0, 2500, 7, dtype=np.uint64)
    got = _scatter(arch, ClassIndex.empty(50), keys, _values(np.random.default_rng(0),
                                                             keys.size), 1)
    assert (got == SENTINEL).all()


def _edge_keys(vocab: int) -> tuple[list[int], list[int]]:
    """Rows near 0 and near V - 1 (and around 2^32 where V x V passes it): as exceptions
    the keys r V + c for c in {0, 1, V - 1}; as pairs those and their neighbours, which
    a division off by one would send to an exception."""
    rows = sorted({0, 1, 2, vocab // 2, vocab - 2, vocab - 1}
                  | ({(2**32) // vocab - 1, (2**32) // vocab} if vocab * vocab > 2**32
                     else set()))
    exceptions = [r * vocab + c for r in rows for c in (0, 1, vocab - 1)]
    pairs = {k + d for k in exceptions for d in (-1, 0, 1, 2) if 0 <= k + d}
    pairs |= {2**32 - 2, 2**32 - 1, 2**32, 2**32 + 1, vocab * vocab - 1, vocab * vocab,
              vocab * vocab + 1}
    return exceptions, sorted(pairs)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("vocab", [2, 3, 256, 65535, 65536, 65537, MAX_VOCAB - 1, MAX_VOCAB])
def test_the_scatter_s_division_is_exact_on_the_edge_keys(arch, vocab):
    """Each pair's key split as key // V, key % V: every edge exception gets its own pair's
    value, and no neighbour (nor a key past V x V) writes anything."""
    exceptions, pairs = _edge_keys(vocab)
    index = _index(vocab, [k for k in exceptions if k < vocab * vocab])
    keys = np.array(pairs, np.uint64)
    values = _values(np.random.default_rng(vocab), len(keys))
    want = _scatter_reference(index, keys, values)
    got = _scatter(arch, index, keys, values, 1)
    assert (got == want).all(), np.flatnonzero(got != want)[:5]
    assert (got != SENTINEL).all()  # every exception's key was among the pairs


def test_the_division_edges_cover_keys_around_2_to_the_32():
    exceptions, pairs = _edge_keys(65537)
    assert any(k < 2**32 <= k + 65537 for k in exceptions)
    assert {2**32 - 1, 2**32, 2**32 + 1} <= set(pairs)
    assert max(pairs) >= 65537 * 65537


# -- health ---------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("classes,grid", [(7, 1), (1029, 1), (3001, 2)])
def test_the_health_check_counts_non_finite_classes_into_what_is_there(arch, classes, grid):
    """V + K not a multiple of 4 (a tail), one or several blocks and grid-stride rounds
    (3001 / 4 quads over 2 x 256 lanes: 2 rounds); the counts add to health's values,
    one with a low word about to carry, and a second launch adds them again."""
    rng = np.random.default_rng(classes)
    tables = [(rng.standard_normal(classes) * 3).astype(np.float32) for _ in range(3)]
    tables[0][[0, classes - 1]] = [np.nan, -np.inf]
    tables[1][classes // 2] = np.inf
    tables[1][1] = 3.4e38  # finite: the largest exponent but one
    tables[2][2::5] = np.array(0xFF800001, np.uint32).view(np.float32)  # NaN, sign set
    start = np.array([0xFFFF_FFFF, 5, 1 << 40], np.uint64)
    counts = np.array([ref.non_finite_count(t) for t in tables], np.uint64)
    assert counts.all()
    health = start.copy()
    image = own.image(sig.COLLAPSED_HEALTH, arch)
    for launch in (1, 2):
        health = run_region(image, sig.COLLAPSED_HEALTH, grid,
                            dict(parameters=tables[0], first_moment=tables[1],
                                 second_moment=tables[2], health=health,
                                 classes=classes))["health"]
        assert health.tolist() == (start + launch * counts).tolist()


# -- every image: checker, printing, the regions ---------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
def test_the_schedules_pass_the_checker(arch):
    for name in REGIONS:
        image = own.image(name, arch)
        assert check(image.code, table(arch)) == [], name
        assert image.registers % 8 == 0 and image.registers <= 255


@pytest.mark.parametrize("arch", ARCHS)
def test_every_instruction_prints_as_nvdisasm_prints_it(arch):
    assert_printed_as_nvdisasm_prints([own.image(name, arch) for name in REGIONS], arch)


@pytest.mark.parametrize("target", [SM90, SM86], ids=lambda t: t.name)
@pytest.mark.parametrize("name", REGIONS)
def test_each_region_passes_own_regions_checks(target, name):
    assert name in OWN_REGIONS
    region = own_region(name, target)
    image = own.image(name, target.name)
    assert region.code == image.code and region.entry == sig.ENTRIES[name]
    assert region.params == sig.SIGNATURES[name]
    assert own.covers(name, MAX_VOCAB)


def test_collapsed_plans_of_both_schedules_are_bob_s_own():
    """The gather, scatter and health check here, the loss and fused kernels beside them: a
    collapsed plan on either schedule is covered by own code."""
    seed = [sig.COLLAPSED_GATHER, sig.COLLAPSED_LOSS_HARD, sig.ARGMAX, sig.ADAMW,
            sig.COLLAPSED_HEALTH, sig.COLLAPSED_SCATTER]
    assert coverage_refusal(seed, 4096) is None
    fused = [sig.COLLAPSED_GATHER, sig.COLLAPSED_FUSED_CORPUS, sig.ARGMAX,
             sig.COLLAPSED_HEALTH, sig.COLLAPSED_SCATTER, sig.COLLAPSED_LOSS_ONLY]
    assert coverage_refusal(fused, 4096) is None
    assert coverage_refusal(fused, 4096, nvrtc=False) is None
