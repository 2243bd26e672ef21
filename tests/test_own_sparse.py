"""Bob's own sparse-input kernels (bob.kernels.own.sparse): the scatter and the loss alone
on the emulator against the NumPy reference, byte for byte, with edge inputs; their
schedules pass bob.isa.check, their instructions print as nvdisasm prints them, and
own_region takes both."""

from __future__ import annotations

import numpy as np
import pytest

from bob.kernels import own
from bob.kernels import reference as ref
from bob.kernels import signatures as sig
from bob.kernels.own import sparse
from bob.program.bob import scatter_grid
from conftest import assert_same_bits
from isa_support import assert_printed_as_nvdisasm_prints
from own_support import (  # noqa: F401 - the fixture
    assert_checked_and_placed,
    code_order,
    reference,
    run_region,
)

ARCHS = ("sm_90", "sm_86")
# Every test on the code in each ordering of its straight runs (bob.isa.builder).
pytestmark = pytest.mark.usefixtures("code_order")
CANONICAL_NAN = 0x7FFFFFFF
# Bits a copy must keep: NaN payloads (quiet and signalling, both signs), -0, subnormals,
# infinities.
EDGE_BITS = np.array([0x7FC00001, 0x7F800001, 0xFFFFFFFF, 0xFFC12345, 0x80000000, 0x00000001,
                      0x807FFFFF, 0x00400000, 0x7F800000, 0xFF800000], np.uint32)


# -- the scatter -----------------------------------------------------------------------------


def scatter_pairs(rng: np.random.Generator, vocab: int, inside: int,
                  ) -> tuple[np.ndarray, np.ndarray]:
    """`inside` distinct keys of the V x V table and keys past it (at V x V, below 2^32,
    and at or above 2^32 with low words inside the table), shuffled; values with edges."""
    cells = vocab * vocab
    keys = rng.choice(cells, size=inside, replace=False).astype(np.uint64)
    outside = np.array([cells, cells + 1, 2**32 - 1, 2**32, 2**32 + 5, 2**32 + cells - 1,
                        2**33 + 7, 2**63, 2**64 - 1], np.uint64)
    keys = np.concatenate([keys, outside])
    rng.shuffle(keys)
    values = (rng.standard_normal(len(keys)) * 3).astype(np.float32).view(np.uint32)
    values[rng.choice(len(keys), len(EDGE_BITS), replace=False)] = EDGE_BITS
    return keys, values.view(np.float32)


def run_scatter(arch: str, vocab: int, keys: np.ndarray, values: np.ndarray, grid: int,
                ) -> None:
    """The own scatter and the reference's into a cleared table (with cleared words past
    its end), compared byte for byte; the cells no key names stay cleared."""
    cells = vocab * vocab
    arguments = {"table": np.zeros(cells + 64, np.uint32), "keys": keys, "values": values,
                 "count": len(keys), "vocab": vocab}
    got = run_region(own.image(sig.SCATTER, arch), sig.SCATTER, grid, arguments)
    want = reference(sig.SCATTER, arguments, grid)
    assert_same_bits("table", got["table"], want["table"])
    named = keys[keys < cells].astype(np.int64)
    untouched = np.ones(cells + 64, bool)
    untouched[named] = False
    assert not got["table"][untouched].any()
    assert (got["table"][named] == values.view(np.uint32)[keys < cells]).all()  # as bits
    for name in ("keys", "values"):
        assert got[name].tobytes() == arguments[name].tobytes()  # read only


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("grid", [1, 2, "plan", 9])
def test_scatter_writes_each_pair_in_the_table_as_bits(arch, grid):
    """1000 pairs (not a whole number of blocks): one block strides 4 rounds, two 2, the
    plan's grid (4 blocks) one, and 9 blocks leave 5 with nothing to do."""
    rng = np.random.default_rng(11)
    keys, values = scatter_pairs(rng, 37, 1000 - 9)
    blocks = scatter_grid(len(keys)) if grid == "plan" else grid
    run_scatter(arch, 37, keys, values, blocks)


@pytest.mark.parametrize("arch", ARCHS)
def test_scatter_at_a_larger_vocabulary_with_the_plan_s_grid(arch):
    rng = np.random.default_rng(12)
    keys, values = scatter_pairs(rng, 300, 3 * 300 - 9)
    run_scatter(arch, 300, keys, values, scatter_grid(len(keys)))


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("count", [0, 1, 255, 257])
def test_scatter_of_few_pairs(arch, count):
    """No pair writes nothing; a block's last lanes and the next block's first."""
    rng = np.random.default_rng(13 + count)
    keys = rng.choice(37 * 37, size=count, replace=False).astype(np.uint64)
    if count:
        keys[-1] = 2**32 + 3  # the last lane's key is past the table
    values = rng.standard_normal(count).astype(np.float32)
    run_scatter(arch, 37, keys, values, scatter_grid(count))


@pytest.mark.parametrize("arch", ARCHS)
def test_scatter_at_v_65536_compares_keys_with_2_to_the_32(arch):
    """V x V = 2^32 wraps to 0 in 32 bits: the keys below it are written, those at or past
    it are not. Only the table's first cells are placed (the keys name no other), so the
    expectation is the dense assignment rather than the reference's V x V view."""
    keys = np.array([2**32, 5, 2**32 + 5, 0, 2**64 - 1, 9], np.uint64)
    values = np.array([1.0, -0.0, 2.0, 1e-45, 3.0, np.nan], np.float32)
    arguments = {"table": np.zeros(16, np.uint32), "keys": keys, "values": values,
                 "count": len(keys), "vocab": 65536}
    got = run_region(own.image(sig.SCATTER, arch), sig.SCATTER, 1, arguments)
    want = np.zeros(16, np.uint32)
    want[[5, 0, 9]] = values.view(np.uint32)[[1, 3, 5]]
    assert_same_bits("table", got["table"], want)


# -- the loss alone --------------------------------------------------------------------------


def loss_inputs(rng: np.random.Generator, vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """Parameters and weights V x V with edges planted, a row each (rows 0..8)."""
    w = (rng.standard_normal((vocab, vocab)) * 3).astype(np.float32)
    t = np.abs(rng.standard_normal((vocab, vocab))).astype(np.float32) / vocab
    t[t < 0.5 / vocab] = 0  # sparse, as a corpus's counts are
    w[0, 3] = np.nan
    w[1, :] = -np.inf
    w[2, 5] = np.inf
    w[3, :] = 0.0
    w[3, 7] = -0.0
    w[4, 2] = 1e-42
    w[5, :] = 1e-40  # a subnormal row
    w[6, ::3] = -1e30  # exponentials that vanish
    t[7, :] = 0.0  # a row no pair starts: zero weights
    t[8, :] = -0.0
    t[4, ::2] = 1e-41  # subnormal weights
    t[2, 1] = np.nan
    t[5, 4] = np.inf
    t[6, 0] = -0.0
    return w, t


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("vocab", [37, 256, 300, 1300])  # 1300: a second trip, partly past V
def test_loss_alone_is_the_reference_s_loss(arch, vocab):
    """Rows with edges, the last row, a middle one, and a block past the last row (the
    grid is the loss's footprint: its word stays as it was)."""
    rng = np.random.default_rng(20 + vocab)
    w, t = loss_inputs(rng, vocab)
    scalars = ref.LossScalars.for_vocab(vocab)
    grid = vocab + 2
    sentinel = np.float32(7.0)
    arguments = dict(parameters=w, weights=t, loss=np.full(grid, sentinel, np.float32),
                     log2e=scalars.log2e, ln2=scalars.ln2, vocab=vocab)
    rows = (*range(9), vocab // 2, vocab - 1, vocab + 1)
    got = run_region(own.image(sig.LOSS_ONLY_CORPUS, arch), sig.LOSS_ONLY_CORPUS, grid,
                     arguments, blocks=rows)
    want = reference(sig.LOSS_ONLY_CORPUS, arguments, grid)
    ran = [row for row in rows if row < vocab]
    assert_same_bits("loss", got["loss"][ran], want["loss"][ran])
    loss, _ = ref.loss_gradient_corpus_rows(w, t, scalars)  # the loss-gradient's loss
    assert_same_bits("loss", got["loss"][ran], loss[ran])
    assert got["loss"][vocab + 1] == sentinel and got["loss"][vocab] == sentinel
    nan = np.isnan(got["loss"][ran])
    assert (got["loss"].view(np.uint32)[ran][nan] == CANONICAL_NAN).all()
    assert nan.any() and not nan.all()  # the edges reach the loss; the rest are numbers


@pytest.mark.parametrize("arch", ARCHS)
def test_loss_alone_does_not_depend_on_mufu_s_last_bits(arch):
    vocab = 37
    w, t = loss_inputs(np.random.default_rng(30), vocab)
    scalars = ref.LossScalars.for_vocab(vocab)
    arguments = dict(parameters=w, weights=t, loss=np.zeros(vocab, np.float32),
                     log2e=scalars.log2e, ln2=scalars.ln2, vocab=vocab)
    rows = (0, 2, 4, 9, 20)
    got = run_region(own.image(sig.LOSS_ONLY_CORPUS, arch), sig.LOSS_ONLY_CORPUS, vocab,
                     arguments, blocks=rows, perturb=2)
    want = reference(sig.LOSS_ONLY_CORPUS, arguments, vocab)
    assert_same_bits("loss", got["loss"][list(rows)], want["loss"][list(rows)])


# -- the images --------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("region", sorted(sparse.BUILDERS))
def test_schedule_passes_the_checker_and_own_region_takes_it(arch, region):
    assert_checked_and_placed(region, arch)


@pytest.mark.parametrize("arch", ARCHS)
def test_sparse_instructions_print_as_nvdisasm_prints_them(arch):
    assert_printed_as_nvdisasm_prints(
        [own.image(region, arch) for region in sorted(sparse.BUILDERS)], arch)
