"""The fused schedule on the CPU: its plan, its certificate, and the seed's bytes exactly.

After an invocation every tensor the seed schedule has (parameters, moments,
gradients, input, both loss blocks, logit rows, predictions; in corpus mode the
weights scattered from the sparse input) must hold the seed schedule's bytes, in
both modes, for one launch per invocation and one launch per update, across
invocation splits.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import bob.program.bob as program
from bob.backends import choose_backend
from bob.backends.cpu import CpuBackend
from bob.host.check import compare_backends, compared_tensors, random_record
from bob.host.session import Session, split_updates
from bob.kernels import reference
from bob.kernels import signatures as sig
from bob.plan.certificate import certify
from bob.plan.model import Address, PointerParam, Scalar
from bob.plan.placement import SM86, SM90
from bob.program.bob import (
    ADAM_SCALARS_TENSOR,
    HEALTH_TENSOR,
    TENSOR_NAMES,
    VALIDATION_INITIAL_LOSS,
    VALIDATION_LOSS,
    VALIDATION_WEIGHTS,
    WEIGHTS_TENSOR,
    BobConfig,
    Hyper,
    adam_scalar_table,
    adam_scalars,
    build_plan,
)
from bob.records.checkpoint import Checkpoint
from conftest import assert_same_bits, bob_config, validation_record


def run_schedule(config: BobConfig, steps: int, kernels: str = "fast",
                 seed: int = 5) -> list[dict[str, bytes]]:
    """Train `steps` updates in invocations of config.updates; the arena after each."""
    record = random_record(config, seed)
    held_out = validation_record(config, seed + 1) if config.validates else None
    rng = np.random.default_rng(seed)
    start = Checkpoint.zeros(config.vocab, Hyper(), config.mode)
    parameters = rng.standard_normal((config.vocab, config.vocab), dtype=np.float32)
    parameters[1] = 0.0  # a row of ties
    state = replace(start, parameters=parameters)
    choice = choose_backend("cpu")
    if kernels == "reference":
        choice = replace(choice, opener=lambda plan: CpuBackend(plan, reference.KERNELS))
    arenas = []
    with Session(choice) as session:
        for updates in split_updates(steps, config.updates):
            state = session.invoke(replace(config, updates=updates), state, record,
                                   "train", validation=held_out).checkpoint
            backend = session.last_backend
            assert backend is not None
            arenas.append({name: backend.read_tensor(name)
                           for name in compared_tensors(backend.plan)})
    return arenas


def assert_same_arenas(seed: list[dict[str, bytes]], fused: list[dict[str, bytes]]) -> None:
    assert len(seed) == len(fused)
    for number, (want, got) in enumerate(zip(seed, fused, strict=True)):
        assert list(got) == list(want)
        for name in want:  # the health counts too
            got_words, want_words = (np.frombuffer(a[name], np.uint32) for a in (got, want))
            assert_same_bits(f"invocation {number}: tensor {name!r}", got_words, want_words,
                             ("fused", "seed"))


@pytest.mark.parametrize("mode", ["hard", "corpus"])
@pytest.mark.parametrize("vocab,prompts,steps,per_invocation", [
    (256, 2, 9, 9), (256, 1, 9, 4), (300, 3, 5, 2), (40, 0, 6, 6), (1100, 1, 3, 2),
])
def test_fused_equals_seed_after_every_invocation(mode, vocab, prompts, steps, per_invocation):
    config = bob_config(vocab=vocab, prompts=prompts, updates=per_invocation, mode=mode)
    seed = run_schedule(config, steps)
    fused = run_schedule(replace(config, schedule="fused"), steps)
    assert_same_arenas(seed, fused)


@pytest.mark.parametrize("vocab,steps,per_invocation", [(40, 5, 2), (300, 3, 3)])
def test_fused_equals_seed_with_validation_on_the_device(vocab, steps, per_invocation):
    """The validation losses of the starting and the trained table, and the validation
    table scattered from its own pairs, are the seed schedule's bytes too."""
    config = bob_config(vocab=vocab, prompts=1, updates=per_invocation, mode="corpus",
                        validation_pairs=vocab + 3)
    seed = run_schedule(config, steps)
    assert {VALIDATION_WEIGHTS, VALIDATION_INITIAL_LOSS, VALIDATION_LOSS} <= set(seed[0])
    assert_same_arenas(seed, run_schedule(replace(config, schedule="fused"), steps))


@pytest.mark.parametrize("mode", ["hard", "corpus"])
@pytest.mark.parametrize("one_launch_max", [16, 16384])
def test_either_launch_split_gives_the_seed_bytes(monkeypatch, mode, one_launch_max):
    """One launch per update, or every update in one launch, whatever V."""
    monkeypatch.setattr(program, "ONE_LAUNCH_MAX_VOCAB", one_launch_max)
    config = bob_config(vocab=64, prompts=2, updates=3, mode=mode)
    assert_same_arenas(run_schedule(config, 7), run_schedule(replace(config, schedule="fused"),
                                                              7))


@pytest.mark.parametrize("mode", ["hard", "corpus"])
def test_held_launches_of_a_few_updates_each_give_the_seed_bytes(monkeypatch, mode):
    """The held kernels' split (here 2 updates a launch, so 2 + 2 + 1 in an invocation of
    5): each launch reads its own rows of the AdamW table, only the last finishes."""
    monkeypatch.setattr(program, "ONE_LAUNCH_MAX_VOCAB", 16)
    monkeypatch.setattr(program, "HELD_FROM_VOCAB", 64)
    monkeypatch.setattr(program, "HELD_UPDATES_PER_LAUNCH", 2)
    config = bob_config(vocab=68, prompts=1, updates=5, mode=mode)
    fused_config = replace(config, schedule="fused")
    assert fused_config.fused_region(SM86) in sig.SHARED_REST
    assert fused_config.training_launches(SM86) == 3 + 1
    assert_same_arenas(run_schedule(config, 7), run_schedule(fused_config, 7))


@pytest.mark.parametrize("mode", ["hard", "corpus"])
def test_the_reference_fused_kernel_equals_the_seed(mode):
    config = bob_config(vocab=96, prompts=1, updates=3, mode=mode)
    assert_same_arenas(run_schedule(config, 5, "reference"),
                       run_schedule(replace(config, schedule="fused"), 5, "reference"))


# -- the plan ---------------------------------------------------------------------------------


# training: the fused launches, then the health check (when N > 0), by mode
@pytest.mark.parametrize("vocab,updates,training", [
    (256, 100, 1 + 1), (1025, 7, 1 + 1), (8192, 3, 1 + 1), (16384, 3, 1 + 1),
    # past 8192 the held kernels, any V, up to 32 updates a launch
    (8193, 7, 1 + 1), (16386, 3, 1 + 1), (16384, 40, 2 + 1),
    # corpus rows held only while they fit whole on the target: past it, one per update
    (52228, 3, {"hard": 1 + 1, "corpus": 3 + 1}),
    (256, 0, 0), (16384, 0, 0),
])
@pytest.mark.parametrize("prompts", [0, 3])
def test_figures_follow_the_documented_formulas(vocab, updates, training, prompts):
    for mode in ("hard", "corpus"):
        config = bob_config(vocab=vocab, prompts=prompts, updates=updates, mode=mode,
                            schedule="fused")
        target = SM90.without_clusters()  # the held and stream figures (no cluster rows)
        plan = build_plan(config, target)
        loads = int(mode == "corpus")  # the sparse input scattered into `weights`
        forward = loads + 1 + 2 * prompts
        expected = training[mode] if isinstance(training, dict) else training
        assert config.training_launches(target) == expected
        assert plan.launch_count == config.launch_count(target) == forward + expected
        assert plan.submission_count == config.submission_count(target) \
            == forward + expected + 2 * prompts
        assert plan.program_bytes == plan.code_extent + plan.launch_count * 1024
        assert certify(plan).holds, certify(plan).hazards
        seed = build_plan(replace(config, schedule="seed"), SM90)
        assert seed.launch_count == forward + 2 * updates + int(updates > 0)
        # one QMD record per launch, whatever the schedule
        assert plan.qmd_table_bytes * seed.launch_count == seed.qmd_table_bytes * plan.launch_count
        # the fused plan adds one tensor after the seed's nine, which keep their addresses;
        # corpus mode's weights follow, health is last
        corpus = [WEIGHTS_TENSOR] if loads else []
        assert [t.name for t in plan.tensors] == [*TENSOR_NAMES, ADAM_SCALARS_TENSOR,
                                                  *corpus, HEALTH_TENSOR]
        assert [t.name for t in seed.tensors] == [*TENSOR_NAMES, *corpus, HEALTH_TENSOR]
        for name in TENSOR_NAMES:
            assert plan.tensor(name) == seed.tensor(name)
        assert plan.tensor(HEALTH_TENSOR).bytes == seed.tensor(HEALTH_TENSOR).bytes == 24
        assert plan.tensor(ADAM_SCALARS_TENSOR).shape == (updates, 8)


def test_the_fused_launches_and_their_footprints():
    # A corpus row longer than any target's shared memory holds, V % 4 != 0: the narrow
    # kernel streams, one launch per update (V % 4 == 0 goes to the stream kernel)
    config = bob_config(vocab=52225, prompts=1, updates=3, mode="corpus", schedule="fused")
    plan = build_plan(config, SM86)
    fused = [launch for launch in plan.launches if launch.region == sig.FUSED_CORPUS]
    assert [launch.label for launch in fused] == ["fused[0]", "fused[1]", "fused[2]"]
    region = plan.region(sig.FUSED_CORPUS)
    names = [p.name for p in region.params]
    scalars_base = plan.tensor(ADAM_SCALARS_TENSOR).address
    for k, launch in enumerate(fused):
        args = dict(zip(names, launch.args, strict=True))
        assert args["updates"] == Scalar.u32(1)
        assert args["finish"] == Scalar.u32(int(k == 2))  # only the last writes gradients
        assert args["adam_scalars"] == Address(scalars_base + 32 * k)
        # the weights the loss reads: the table the sparse input is scattered into
        assert args["weights"] == Address(plan.tensor(WEIGHTS_TENSOR).address)
        assert launch.grid.x == 52225
    assert {p.name for p in plan.placed_regions} == {
        sig.GATHER, sig.LOSS_CORPUS, sig.FUSED_CORPUS, sig.ARGMAX, sig.HEALTH, sig.SCATTER}
    # the health check is the last launch, after the last fused one
    assert plan.launches[-1].region == sig.HEALTH and plan.launches[-2].label == "fused[2]"
    small = build_plan(replace(config, vocab=256, updates=50, pairs=300), SM86)
    (launch,) = [launch for launch in small.launches if launch.region == sig.FUSED_CORPUS]
    args = dict(zip(names, launch.args, strict=True))
    assert (args["updates"], args["finish"]) == (Scalar.u32(50), Scalar.u32(1))


@pytest.mark.parametrize("mode", ["hard", "corpus"])
def test_the_certificate_catches_a_fused_launch_reaching_too_far(mode):
    config = bob_config(vocab=1100, prompts=0, updates=2, mode=mode, schedule="fused")
    plan = build_plan(config)
    index = next(i for i, launch in enumerate(plan.launches)
                 if launch.region == config.fused_region(plan.target))
    region = plan.region(config.fused_region(plan.target))
    position = [p.name for p in region.params].index("updates")
    launch = plan.launches[index]
    args = list(launch.args)
    args[position] = Scalar.u32(3)  # one more row of scalars than the tensor holds
    planted = replace(plan, launches=(*plan.launches[:index], replace(launch, args=tuple(args)),
                                      *plan.launches[index + 1:]))
    hazards = certify(planted).hazards
    assert [h.kind for h in hazards] == ["footprint-overflow"]
    assert hazards[0].argument == "adam_scalars" and hazards[0].tensor == ADAM_SCALARS_TENSOR
    with pytest.raises(ValueError, match="no AdamW launches"):
        config.adamw_launch(0)


def test_the_scalar_table_holds_the_seed_scalars():
    for hyper in (Hyper(), Hyper(lr=3e-4, beta1=0.5, beta2=0.95, eps=1e-12, weight_decay=0.3),
                  Hyper(lr=1e38), Hyper(lr=1e39, eps=1e-45)):
        table = adam_scalar_table(hyper, 997, 40)
        assert table.dtype == np.float32 and table.shape == (40, 8)
        assert (table[:, 7] == 0).all()
        for k in range(40):
            want = [s.bits for s in adam_scalars(hyper, 997 + k).values()]
            assert list(table[k, :7].view(np.uint32)) == want, (hyper, k)


def test_the_session_writes_the_scalars_of_the_global_steps():
    config = BobConfig(vocab=32, prompts=0, updates=4, mode="hard", schedule="fused")
    record = random_record(config, 1)
    start = replace(Checkpoint.zeros(32, Hyper(), "hard"), step=10)
    with Session(choose_backend("cpu")) as session:
        session.invoke(config, start, record, "train")
        backend = session.last_backend
        assert backend is not None
        written = backend.read_tensor(ADAM_SCALARS_TENSOR)
    assert written == adam_scalar_table(Hyper(), 11, 4).tobytes()


def test_fused_and_seed_checkpoints_agree_through_the_api(tmp_path):
    """A whole training run through the host: the checkpoints are the same bytes."""
    config = bob_config(vocab=256, prompts=0, updates=25, mode="corpus")
    runs = {schedule: run_schedule(replace(config, schedule=schedule), 50)
            for schedule in ("seed", "fused")}
    assert_same_arenas(runs["seed"], runs["fused"])
    record = random_record(config, 2)
    with Session(choose_backend("cpu")) as a, Session(choose_backend("cpu")) as b:
        for session, schedule in ((a, "seed"), (b, "fused")):
            session.invoke(replace(config, schedule=schedule), Checkpoint.zeros(
                256, Hyper(), "corpus"), record, "train")
        assert compare_backends(a.last_backend, b.last_backend, 0) is None


def test_bob_train_with_either_schedule_writes_the_same_checkpoint(tmp_path):
    from bob.cli.main import main

    paths = {schedule: tmp_path / f"{schedule}.safetensors" for schedule in ("seed", "fused")}
    for schedule, path in paths.items():
        assert main(["train", "--steps", "60", "-N", "25", "-c", str(path), "--backend", "cpu",
                     "--schedule", schedule]) == 0
    assert paths["seed"].read_bytes() == paths["fused"].read_bytes()
    assert main(["check", "--backends", "cpu,nv-sim", "--schedule", "fused", "-V", "40",
                 "--steps", "5", "-N", "3"]) == 0


def test_the_scalar_table_equals_the_per_step_scalars_bit_for_bit():
    """The fused schedule's scalars are exactly the seed schedule's parameter-block scalars."""
    from bob.program.bob import ADAM_SCALAR_NAMES, adam_scalar_table, adam_scalars

    hyper = Hyper(lr=0.37, beta1=0.81, beta2=0.9973, eps=3e-7, weight_decay=0.02)
    table = adam_scalar_table(hyper, 17, 300).view(np.uint32)
    for k in range(300):
        scalars = adam_scalars(hyper, 17 + k)
        assert [int(b) for b in table[k, :len(ADAM_SCALAR_NAMES)]] == \
            [scalars[name].bits for name in ADAM_SCALAR_NAMES]
        assert table[k, -1] == 0


@pytest.mark.parametrize("mode", ["hard", "corpus"])
def test_rows_that_fit_on_chip_get_the_wide_or_tall_kernel(mode):
    """1024 < V <= 4096: the wide region; from where it is faster (4608 hard, 5121 corpus)
    to 8192 the tall one (sig.TALL_BLOCKS: 1024 threads hard, 512 corpus); past it the held
    one (512 threads), any V (corpus rows to 52224); other streamed rows the stream one
    when V % 4 == 0, else narrow. One signature everywhere, the stream and held ones'
    tables 16-byte aligned (the stream one moves them as float4, the held one where
    V % 4 == 0)."""
    hard = mode == "hard"
    narrow = sig.FUSED_HARD if hard else sig.FUSED_CORPUS
    wide = sig.FUSED_WIDE_HARD if hard else sig.FUSED_WIDE_CORPUS
    tall = sig.FUSED_TALL_HARD if hard else sig.FUSED_TALL_CORPUS
    stream = sig.FUSED_STREAM_HARD if hard else sig.FUSED_STREAM_CORPUS
    held = sig.FUSED_HELD_HARD if hard else sig.FUSED_HELD_CORPUS
    first_tall = 4608 if hard else 5121
    for vocab, region, block in ((256, narrow, 256), (1024, narrow, 256), (1025, wide, 256),
                                 (4096, wide, 256), (4097, narrow, 256), (4100, stream, 256),
                                 (first_tall - 1, narrow if hard else stream, 256),
                                 (first_tall, tall, sig.TALL_BLOCKS[tall]),
                                 (8192, tall, sig.TALL_BLOCKS[tall]), (8193, held, 512),
                                 (8196, held, 512), (9000, held, 512), (9002, held, 512),
                                 (50257, held, 512), (52224, held, 512),
                                 (52225, held if hard else narrow, 512 if hard else 256),
                                 (52228, held if hard else stream, 512 if hard else 256),
                                 (65536, held if hard else stream, 512 if hard else 256)):
        config = bob_config(vocab=vocab, prompts=0, updates=2, mode=mode, schedule="fused")
        target = SM90.without_clusters()  # cluster rows: tests/test_cluster.py
        assert config.fused_region(target) == region, vocab
        plan = build_plan(config, target)
        assert certify(plan).holds, certify(plan).hazards
        fused = [launch for launch in plan.launches if launch.region == region]
        assert fused and all(launch.block.x == block for launch in fused)
        assert plan.region(region).block_x == block
        params = plan.region(region).params
        assert [p.name for p in params] == [p.name for p in sig.SIGNATURES[narrow]]
        quads = {p.name for p in params if isinstance(p, PointerParam) and p.align == 16}
        tables = {"parameters", "first_moment", "second_moment", "gradients"} | (
            set() if hard else {"weights"})
        assert quads == (tables if region in (stream, held) else set()), (vocab, quads)


# -- the table's powers: NumPy's, checked against C's pow where it could matter ----------

TABLE_HYPERS = (
    Hyper(), Hyper(lr=3e-4, beta1=0.5, beta2=0.95, eps=1e-12, weight_decay=0.3),
    Hyper(beta1=0.5, beta2=0.99999), Hyper(beta2=0.999999999),  # steps flagged for long
    Hyper(lr=3e38), Hyper(lr=1e39, eps=1e-45),  # overflow to inf, subnormal eps_hat
    Hyper(lr=1e-40), Hyper(beta1=0.0, beta2=0.0),
)


@pytest.mark.parametrize("hyper", TABLE_HYPERS, ids=str)
def test_the_fast_step_columns_are_the_exact_ones_over_many_steps(hyper):
    """NumPy's powers with C's pow where a row is unsure: the bits of C's pow everywhere,
    over the first 200,000 steps and a window far out."""
    from bob.program.bob import _exact_step_columns, _step_columns

    for first, count in ((1, 200_000), (10**9, 5_000)):
        steps = np.arange(first, first + count, dtype=np.int64)
        fast, exact = _step_columns(hyper, steps), _exact_step_columns(hyper, steps)
        for got, want in zip(fast, exact, strict=True):
            assert (got.view(np.uint32) == want.view(np.uint32)).all(), (hyper, first)


@pytest.mark.parametrize("hyper", TABLE_HYPERS[:4], ids=str)
def test_powers_a_few_ulps_off_still_give_the_exact_columns(monkeypatch, hyper):
    """Another NumPy (a SIMD route) may give powers off in their last bits: with every
    power moved by up to 32 ulps at random, the check sends the rows it could change to
    C's pow, so the table keeps its bits; and with beta2 near 1 (wide bounds over many
    steps) it does send some."""
    import bob.program.bob as program

    rng = np.random.default_rng(5)
    true_power = np.power
    sent: list[int] = []
    exact_columns = program._exact_step_columns

    def shaky_power(base, exponents):
        exact = true_power(base, exponents)
        moves = rng.integers(-32, 33, exact.shape)
        return (exact.view(np.int64) + moves * (exact > 0)).view(np.float64)

    def counted(hyper, steps, lr=None):
        sent.append(steps.size)
        return exact_columns(hyper, steps, lr)

    steps = np.arange(1, 100_001, dtype=np.int64)
    want = exact_columns(hyper, steps)
    monkeypatch.setattr(program.np, "power", shaky_power)
    monkeypatch.setattr(program, "_exact_step_columns", counted)
    got = program._step_columns(hyper, steps)
    for column, exact in zip(got, want, strict=True):
        assert (column.view(np.uint32) == exact.view(np.uint32)).all(), hyper
    assert sum(sent) < steps.size  # most rows are not checked again
    if hyper.beta2 >= 0.99999:  # 2 and 8,703 of these 100,000 rows are
        assert sent


@pytest.mark.parametrize("beta", [0.9, 0.5, 0.95, 0.999, 0.99999, 1e-300])
def test_powers_that_cannot_matter_are_not_computed_where_they_underflow(beta):
    """_powers gives NumPy's power until it falls below 2^-70, and past that a power
    below 2^-69 (NumPy computes underflowing ones slowly): 1 - beta^t is 1 either way."""
    from bob.program.bob import _powers

    exponents = np.unique(np.round(np.geomspace(1.0, 1e9, 100_000)))
    got, numpy = _powers(beta, exponents), np.power(beta, exponents)
    same = got == numpy
    assert same[numpy >= 2.0**-69].all()  # no power that could matter is changed
    assert (got[~same] < 2.0**-69).all()
    assert (got[~same] >= np.finfo(np.float64).tiny).all()  # normal: no underflow path
    assert (~same).any()  # this range reaches the powers that underflow
    assert (1.0 - got[~same] == 1.0).all() and (1.0 - numpy[~same] == 1.0).all()


def test_values_round_alike_only_where_the_whole_bound_rounds_to_one_binary32():
    from bob.program.bob import _rounds_alike

    one = np.float64(1.0)
    midpoint = one + 2.0**-24  # halfway between binary32 1 and its successor
    values = np.array([midpoint, np.nextafter(midpoint, 2.0), one, 1.0 + 2.0**-23,
                       0.0, -1.0, np.inf, np.nan, 3.0e38, 2.0**128 - 2.0**103])
    bound = np.full(values.shape, 2.0**-50)
    with np.errstate(over="ignore", invalid="ignore"):  # as _step_columns calls it
        rounded = values.astype(np.float32)
        alike = _rounds_alike(values, rounded, bound)
    assert alike.tolist() == [
        False, False,  # on a boundary, one ulp of it away
        True, True,  # binary32 values themselves: as far from a boundary as can be
        True, True, True,  # zero, a negative value, inf: every neighbour rounds alike
        False,  # NaN
        True,  # 3e38: far from its boundaries
        False]  # the boundary to inf: above it rounds to inf, below to the largest float
    assert _rounds_alike(np.array([np.nextafter(midpoint, 2.0)]),
                         np.array([np.float32(1.0 + 2.0**-23)]),
                         np.array([2.0**-60])).all()  # 1 ulp of it > 2^-60 2^53 ulps


@settings(max_examples=150, deadline=None)
@given(lr=st.floats(1e-12, 1e6), beta1=st.floats(0.0, 0.999999),
       beta2=st.floats(0.0, 0.999999999), eps=st.floats(1e-30, 1.0),
       first=st.integers(1, 10**12))
def test_the_scalar_table_is_the_per_step_scalars_for_any_hyperparameters(lr, beta1, beta2, eps,
                                                                          first):
    hyper = Hyper(lr=lr, beta1=beta1, beta2=beta2, eps=eps)
    table = adam_scalar_table(hyper, first, 24).view(np.uint32)
    for k in range(24):
        assert [int(b) for b in table[k, :7]] == \
            [s.bits for s in adam_scalars(hyper, first + k).values()], (hyper, first + k)
