"""The fast plan path gives the plan and the certificate the plain definitions give.

``build_plan`` takes the seed's AdamW scalars from one vectorised table, caches 1/V,
places each distinct launch once; ``certify`` checks each distinct launch key once.
Here the plan's JSON is compared with launches rebuilt from first principles (the
program as the module docstring of ``bob.program.bob`` states it, the scalars from the
per-step ``adam_scalars``, 1/V rounded exactly, pointers at page-aligned tensors), and
the certificate with every launch checked on its own.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from fractions import Fraction

import numpy as np
import pytest

from bob.config import Hyper
from bob.kernels import signatures as sig
from bob.kernels.exact import f32_bits_from_fraction
from bob.plan import certificate as cert
from bob.plan.certificate import certify
from bob.plan.jsonio import dumps
from bob.plan.model import Address, Dim3, Launch, Plan, Scalar, Target, Tensor
from bob.plan.placement import SM86, SM90, align_up
from bob.program.bob import (
    ADAM_SCALAR_NAMES,
    ADAM_SCALAR_STRIDE,
    ADAM_SCALARS_TENSOR,
    HEALTH_TENSOR,
    LN2_BITS,
    LOG2E_BITS,
    BobConfig,
    adam_scalar_table,
    adam_scalars,
    adamw_grid,
    adamw_scalar_arguments,
    build_plan,
    health_grid,
    tensor_specs,
)
from conftest import bob_plan, stand_in_regions

# -- AdamW's scalars: the table against the per-step function ---------------------------

HYPERS = (
    Hyper(),
    Hyper(lr=0.05, beta1=0.0, beta2=0.5, eps=1e-3, weight_decay=0.0),
    Hyper(lr=3e-4, beta1=0.99, beta2=0.999999, eps=1e-12, weight_decay=0.1),
    Hyper(lr=1e308, beta1=0.999999),  # step_size overflows float64: inf, as per step
    Hyper(lr=1e30, weight_decay=1e-20),  # f32 overflow only
)
# Step 1, the first thousands, where beta2**step is still far from 0, steps where it
# underflows, and steps far beyond any run.
STEP_RANGES = ((1, 2500), (99_990, 20), (2**31 - 5, 10), (10**15, 5))


def _per_step_bits(hyper: Hyper, step: int) -> list[int]:
    scalars = adam_scalars(hyper, step)
    return [scalars[name].bits for name in ADAM_SCALAR_NAMES]


@pytest.mark.parametrize("hyper", HYPERS, ids=range(len(HYPERS)))
def test_adam_scalar_table_is_the_per_step_function_bit_for_bit(hyper):
    for first, count in STEP_RANGES:
        table = adam_scalar_table(hyper, first, count).view(np.uint32)
        assert table.shape == (count, ADAM_SCALAR_STRIDE)
        for k in range(count):
            want = _per_step_bits(hyper, first + k)
            got = table[k, :len(ADAM_SCALAR_NAMES)].tolist()
            assert got == want, f"step {first + k}: {got} != {want}"
        assert not table[:, len(ADAM_SCALAR_NAMES):].any()  # the padding


def test_adam_scalar_table_for_random_hypers():
    rng = np.random.default_rng(13)
    for _ in range(25):
        hyper = Hyper(lr=float(10 ** rng.uniform(-6, 1)), beta1=float(rng.uniform(0, 0.99)),
                      beta2=float(rng.uniform(0.9, 0.99999)),
                      eps=float(10 ** rng.uniform(-12, -3)),
                      weight_decay=float(rng.uniform(0, 0.1)))
        first = int(rng.integers(1, 100_000))
        table = adam_scalar_table(hyper, first, 60).view(np.uint32)
        for k in range(60):
            assert table[k, :len(ADAM_SCALAR_NAMES)].tolist() == _per_step_bits(hyper, first + k)


def test_adam_scalar_table_refuses_step_zero():
    with pytest.raises(ValueError, match="count from 1"):
        adam_scalar_table(Hyper(), 0, 3)
    assert adam_scalar_table(Hyper(), 0, 0).shape == (0, ADAM_SCALAR_STRIDE)


def test_adamw_arguments_are_the_per_step_scalars_in_the_signature_order():
    f32_params = [p.name for p in sig.SIGNATURES[sig.ADAMW][4:11]]
    for hyper in HYPERS:
        arguments = adamw_scalar_arguments(hyper, 7, 300)
        assert len(arguments) == 300
        for k, scalars in enumerate(arguments):
            per_step = adam_scalars(hyper, 7 + k)
            assert scalars == tuple(per_step[name] for name in f32_params), k


# -- the plan: JSON against launches from first principles -------------------------------


def _tensor_addresses(config: BobConfig, plan: Plan) -> dict[str, int]:
    """Each tensor after the previous, at page alignment, from the arena's base."""
    addresses, address = {}, plan.address_map.arena.base
    for spec in tensor_specs(config):
        address = align_up(address, plan.page_bytes)
        addresses[spec.name] = address
        address += spec.bytes
    return addresses


def _reference_launches(config: BobConfig, target: Target, hyper: Hyper, first_step: int,
                        addresses: dict[str, int]) -> list[Launch]:
    """The launches of bob.program.bob's module docstring, built one by one."""
    v, block = config.vocab, Dim3(sig.BLOCK)
    vocab = Scalar("u32", v)
    log2e, ln2 = Scalar("f32", LOG2E_BITS), Scalar("f32", LN2_BITS)
    inverse = Scalar("f32", f32_bits_from_fraction(Fraction(1, v)))
    hard = config.mode == "hard"

    def at(name: str, offset: int = 0) -> Address:
        return Address(addresses[name] + offset)

    # The loss's targets: the input's (hard), the table the input's pairs are scattered
    # into (corpus).
    targets = "input" if hard else "weights"

    def loss(into: str) -> Launch:
        data = (log2e, ln2, inverse) if hard else (log2e, ln2)
        return Launch(config.loss_region, Dim3(v), block, (
            at("parameters"), at("gradients"), at(targets), at(into), *data, vocab,
        ), f"loss->{into}")

    def scatter(table: str, pairs: str, count: int) -> Launch:
        # keys u64[K] at the pairs' start, values f32[K] after them; a thread per pair, at
        # most 4096 blocks
        grid = Dim3(max(1, min(-(-count // sig.BLOCK), 4096)))
        return Launch(sig.SCATTER, grid, block, (
            at(table), at(pairs), at(pairs, 8 * count), Scalar("u32", count), vocab,
        ), f"scatter->{table}")

    def validation_loss(into: str) -> Launch:
        return Launch(sig.LOSS_ONLY_CORPUS, Dim3(v), block, (
            at("parameters"), at("validation_weights"), at(into), log2e, ln2, vocab,
        ), f"validation->{into}")

    launches = []
    if not hard:
        launches.append(scatter("weights", "input", config.pairs))
    if config.validation_pairs:
        launches.append(scatter("validation_weights", "validation_input",
                                config.validation_pairs))
    launches.append(loss("initial_loss"))
    if config.validation_pairs:
        launches.append(validation_loss("validation_initial_loss"))
    for i in range(config.prompts):
        row = at("logit_rows", 4 * v * i)
        launches.append(Launch(sig.GATHER, Dim3(1), block, (
            row, at("input", config.input_targets_bytes + 4 * i), at("parameters"), vocab,
        ), f"gather[{i}]"))
        launches.append(Launch(sig.ARGMAX, Dim3(1), block, (
            at("predictions", 4 * i), row, vocab), f"argmax[{i}]"))
    if config.schedule == "seed":
        for k in range(config.updates):
            scalars = adam_scalars(hyper, first_step + k)
            launches.append(Launch(sig.ADAMW, Dim3(adamw_grid(v * v)), block, (
                at("parameters"), at("gradients"), at("first_moment"), at("second_moment"),
                *(scalars[p.name] for p in sig.SIGNATURES[sig.ADAMW][4:11]), vocab, vocab,
            ), f"adamw[{k}]"))
            launches.append(loss("training_loss"))
    elif config.updates:
        each = config.updates_per_fused_launch(target)
        region = config.fused_region(target)
        for first in range(0, config.updates, each):
            data = (log2e, ln2, inverse) if hard else (log2e, ln2)
            count = min(each, config.updates - first)  # the last launch may run fewer
            label = f"fused[{first}]" if count == 1 else f"fused[{first}:{first + count}]"
            launches.append(Launch(region, Dim3(v), Dim3(sig.block_of(region)), (
                at("parameters"), at("first_moment"), at("second_moment"), at("gradients"),
                at(targets), at("training_loss"),
                at(ADAM_SCALARS_TENSOR, 4 * ADAM_SCALAR_STRIDE * first), *data, vocab,
                Scalar("u32", count), Scalar("u32", int(first + count == config.updates)),
            ), label))
    if config.updates:
        launches.append(Launch(sig.HEALTH, Dim3(health_grid(v * v)), block, (
            *(at(name) for name in sig.HEALTH_COUNTS), at(HEALTH_TENSOR), vocab), "health"))
        if config.validation_pairs:
            launches.append(validation_loss("validation_loss"))
    return launches


def _configs() -> list[tuple[BobConfig, Hyper, int, bool]]:
    """Every V from 2 to 300, each with one combination in turn, then every combination
    at the V where the regions change (1024, 4096, the tall ones, 8192) and a few more."""
    combos = list(itertools.product(("seed", "fused"), ("hard", "corpus"), (0, 3), (0, 1, 7),
                                    ("per-launch", "chained")))
    hypers = (Hyper(), Hyper(lr=0.05, beta1=0.5, weight_decay=0.0))
    chosen = []
    for i, v in enumerate(range(2, 301)):
        chosen.append((v, combos[i % len(combos)], hypers[i % 2], (1, 997)[i % 3 == 0]))
    for v in (2, 255, 256, 257, 1024, 1025, 4096, 4608, 5121, 8192):
        for j, combo in enumerate(combos):
            chosen.append((v, combo, hypers[j % 2], (1, 997)[j % 3 == 0]))
    out = []
    for n, (v, (schedule, mode, prompts, updates, submission), hyper, first_step) in \
            enumerate(chosen):
        # corpus: K from one pair to every cell, and validation in every other plan
        sparse = {} if mode == "hard" else {
            "pairs": (1, v, v * v)[n % 3], "validation_pairs": (0, min(7, v * v))[n % 2]}
        config = BobConfig(vocab=v, prompts=prompts, updates=updates, mode=mode,
                           schedule=schedule, submission=submission, **sparse)
        out.append((config, hyper, first_step))
    return out


def test_plans_are_their_first_principles_launches_in_json():
    checked = 0
    for n, (config, hyper, first_step) in enumerate(_configs()):
        target = (SM86, SM90)[n % 2]
        compiled = stand_in_regions(config, target) if n % 5 == 0 else None
        plan = build_plan(config, target, hyper, first_step, compiled)
        launches = _reference_launches(config, target, hyper, first_step,
                                       _tensor_addresses(config, plan))
        assert len(launches) == config.launch_count(target)
        reference = replace(plan, launches=tuple(launches))
        got, want = json.loads(dumps(plan)), json.loads(dumps(reference))
        if got != want:
            first = next(i for i, (a, b) in enumerate(
                zip(got["launches"], want["launches"], strict=True)) if a != b)
            pytest.fail(f"{config} first_step {first_step}: launch {first} is "
                        f"{got['launches'][first]}, from first principles "
                        f"{want['launches'][first]}")
        checked += 1
    assert checked > 700


def test_a_seed_plan_at_the_timed_size_is_its_first_principles_launches():
    config = BobConfig(vocab=256, prompts=0, updates=1000)
    plan = build_plan(config)
    reference = _reference_launches(config, plan.target, Hyper(), 1,
                                    _tensor_addresses(config, plan))
    assert dumps(plan) == dumps(replace(plan, launches=tuple(reference)))


# -- the certificate: checked once per key, the same hazards as every launch alone -------


def _every_launch_alone(plan: Plan) -> list[cert.Hazard]:
    """certify without the memo: each launch's checks run at each launch."""
    declared = {r.name: r for r in plan.regions}
    retained = {p.name for p in plan.placed_regions}
    hazards = cert._check_tensors(plan) + cert._check_regions(plan)
    for index, launch in enumerate(plan.launches):
        hazards += cert._check_launch(plan, declared, retained, index, launch)
    hazards += cert._check_submissions(plan)
    hazards += [h for region in plan.regions for h in cert._region_limits(plan, region)]
    for index, launch in enumerate(plan.launches):
        hazards += cert._launch_limits(plan, index, launch, declared.get(launch.region))
    return hazards


def _with_launch(plan: Plan, index: int, launch: Launch) -> Plan:
    launches = list(plan.launches)
    launches[index] = launch
    return replace(plan, launches=tuple(launches))


def _with_arg(launch: Launch, position: int, arg: Address | Scalar) -> Launch:
    args = list(launch.args)
    args[position] = arg
    return replace(launch, args=tuple(args))


def _seed_plan() -> Plan:
    # Updates 0 and 1 have the same key (their f32 scalars differ, and no check reads them).
    return bob_plan(prompts=1, updates=4, vocab=64)


def _adamw_indices(plan: Plan) -> list[int]:
    return [i for i, launch in enumerate(plan.launches) if launch.region == sig.ADAMW]


def _hazards_at(plan: Plan, index: int) -> tuple[cert.Hazard, ...]:
    """The plan's hazards, all of them at launch `index` and named for it."""
    hazards = certify(plan).hazards
    assert hazards, "no hazard reported"
    for hazard in hazards:
        assert hazard.launch == index, str(hazard)
        assert f"launch {index} (" in hazard.message
    assert list(hazards) == _every_launch_alone(plan)
    return hazards


def _only_hazard_at(plan: Plan, index: int) -> cert.Hazard:
    (hazard,) = _hazards_at(plan, index)
    return hazard


def test_the_same_key_passes_once_and_differing_f32_values_share_it():
    plan = _seed_plan()
    first, second = _adamw_indices(plan)[:2]
    assert plan.launches[first].args[9] != plan.launches[second].args[9]  # step sizes
    assert cert._launch_key(plan.launches[first]) == cert._launch_key(plan.launches[second])
    assert certify(plan).holds and _every_launch_alone(plan) == []


def test_a_pointer_argument_is_in_the_key():
    plan = _seed_plan()
    good, bad = _adamw_indices(plan)[:2]
    launch = plan.launches[bad]
    shifted = _with_arg(launch, 2, Address(launch.args[2].address + 4))  # first_moment
    hazard = _only_hazard_at(_with_launch(plan, bad, shifted), bad)
    assert hazard.kind == "footprint-overflow" and hazard.argument == "first_moment"


def test_a_u32_argument_that_scales_a_footprint_is_in_the_key():
    plan = _seed_plan()
    good, bad = _adamw_indices(plan)[:2]
    rows = _with_arg(plan.launches[bad], 11, Scalar("u32", 65))  # one row past each table
    hazards = _hazards_at(_with_launch(plan, bad, rows), bad)
    assert {h.kind for h in hazards} == {"footprint-overflow"}
    assert [h.argument for h in hazards] == [
        "parameters", "gradients", "first_moment", "second_moment"]


def test_an_f32_argument_past_32_bits_or_of_the_wrong_type_is_in_the_key():
    plan = _seed_plan()
    good, bad = _adamw_indices(plan)[:2]
    for arg in (Scalar("f32", 1 << 32), Scalar("u32", 5), Address(0)):
        wrong = _with_arg(plan.launches[bad], 9, arg)  # step_size
        hazard = _only_hazard_at(_with_launch(plan, bad, wrong), bad)
        assert hazard.kind == "argument-mismatch" and hazard.argument == "step_size"


def test_region_grid_and_block_are_in_the_key():
    plan = _seed_plan()
    good, bad = _adamw_indices(plan)[:2]
    launch = plan.launches[bad]
    cases = (
        (replace(launch, block=Dim3(128)), "geometry"),
        (replace(launch, grid=Dim3(launch.grid.x, 70_000)), "hardware-limit"),
        (replace(launch, region=sig.ARGMAX), "argument-mismatch"),
        (replace(launch, region="bob-nowhere"), "unknown-region"),
    )
    for changed, kind in cases:
        assert _only_hazard_at(_with_launch(plan, bad, changed), bad).kind == kind


def test_a_bad_launch_repeated_is_reported_at_each_place():
    plan = _seed_plan()
    indices = _adamw_indices(plan)
    launch = plan.launches[indices[0]]
    bad = _with_arg(launch, 0, Address(launch.args[0].address + 4))
    for index in indices[1:3]:
        plan = _with_launch(plan, index, bad)
    hazards = certify(plan).hazards
    assert [h.launch for h in hazards] == indices[1:3]
    assert list(hazards) == _every_launch_alone(plan)


def test_random_edits_give_the_hazards_of_every_launch_checked_alone():
    rng = np.random.default_rng(5)
    base = bob_plan(prompts=2, updates=12, vocab=32)
    for _ in range(60):
        plan = base
        for index in rng.choice(len(base.launches), size=3, replace=False).tolist():
            plan = _with_launch(plan, index, _edited(plan.launches[index], rng))
        assert list(certify(plan).hazards) == _every_launch_alone(plan)


def _edited(launch: Launch, rng: np.random.Generator) -> Launch:
    position = int(rng.integers(len(launch.args)))
    arg = launch.args[position]
    choice = int(rng.integers(4))
    if choice == 0 and isinstance(arg, Address):
        return _with_arg(launch, position, Address(arg.address + int(rng.choice([4, 1024]))))
    if choice == 1 and isinstance(arg, Scalar):
        bits = int(rng.choice([0, arg.bits + 1, 1 << 32]))
        return _with_arg(launch, position, Scalar(arg.dtype, bits))
    if choice == 2:
        return replace(launch, block=Dim3(int(rng.choice([128, 256, 2048]))))
    return replace(launch, grid=Dim3(launch.grid.x, int(rng.choice([1, 70_000]))))


# -- tensor_at: the index against its definition ------------------------------------------


def test_tensor_at_is_the_holder_starting_last_first_in_the_plan_among_ties():
    rng = np.random.default_rng(11)
    plan = bob_plan()
    for _ in range(200):
        tensors = tuple(
            Tensor(f"t{i}", "u8", (size,), int(start), int(size), 1)
            for i, (start, size) in enumerate(zip(rng.integers(0, 64, 6).tolist(),
                                                  rng.integers(0, 24, 6).tolist(), strict=True))
        )
        edited = replace(plan, tensors=tensors)
        for address in range(-2, 96):
            holders = [t for t in tensors if t.address <= address < t.end]
            want = max(holders, key=lambda t: t.address, default=None)
            assert edited.tensor_at(address) is want, (tensors, address)
