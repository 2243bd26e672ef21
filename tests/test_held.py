"""The held kernels' plumbing, checked without a GPU: which rows the plan gives them and
with what grid, the dynamic shared memory a region asks for at launch (compiled image,
plan file, certificate), and how Bob's own stream passes it (the QMD's shared memory, the
driver area word %dynamic_smem_size reads, the simulator's checks). The kernels' bytes
against the CPU: tests/test_held_gpu.py.
"""

from __future__ import annotations

import json
import struct
from dataclasses import replace

import pytest

import bob.kernels.signatures as sig
from bob.backends.nv import decoder, encoder
from bob.backends.nv.sim import NvSimBackend, NvSimError
from bob.cli.main import main
from bob.errors import BadInput
from bob.kernels.cuda.regions import catalogue
from bob.plan.certificate import certify
from bob.plan.jsonio import dumps, loads
from bob.plan.model import Address, Scalar
from bob.plan.placement import SM86, SM90
from bob.program.bob import (
    ADAM_SCALAR_STRIDE,
    ADAM_SCALARS_TENSOR,
    HELD_UPDATES_PER_LAUNCH,
    MAX_DENSE_VOCAB,
    BobConfig,
    build_plan,
    held_to_vocab,
)
from conftest import bob_config, stand_in_regions


def compiled(arch: str):
    pytest.importorskip("cuda.bindings.nvrtc", reason="the kernels compile with NVRTC")
    from bob.kernels.cuda.regions import compiled_regions

    return compiled_regions(arch)


# -- which rows, which grid -----------------------------------------------------------------


def test_the_longest_held_corpus_row_is_what_the_targets_shared_memory_holds_whole():
    # sm_90: 227 KiB less the kernel's own 22608 bytes, in whole KiB, as floats
    assert held_to_vocab("corpus", SM90) == (232448 - 22608) // 1024 * 1024 // 4 == 52224
    assert held_to_vocab("corpus", SM86) == (101376 - 22608) // 1024 * 1024 // 4 == 19456
    assert held_to_vocab("hard", SM90) == held_to_vocab("hard", SM86) == MAX_DENSE_VOCAB


@pytest.mark.parametrize("vocab, mode, region", [
    (8192, "hard", sig.FUSED_TALL_HARD),  # the tall kernels' last row length
    (8196, "hard", sig.FUSED_HELD_HARD),
    (8196, "corpus", sig.FUSED_HELD_CORPUS),
    (32768, "hard", sig.FUSED_HELD_HARD),
    (52224, "corpus", sig.FUSED_HELD_CORPUS),  # held whole in an sm_90 block
    (52228, "corpus", sig.FUSED_STREAM_CORPUS),  # past it, streamed
    (52228, "hard", sig.FUSED_HELD_HARD),  # hard: held in part, the rest streamed
    (MAX_DENSE_VOCAB, "hard", sig.FUSED_HELD_HARD),
    (65536, "corpus", sig.FUSED_STREAM_CORPUS),
    (4100, "hard", sig.FUSED_STREAM_HARD),  # below the tall rows: streamed
    (8194, "hard", sig.FUSED_HELD_HARD),  # any V: a row of V % 4 != 0 from its 16-byte boundary
    (50257, "corpus", sig.FUSED_HELD_CORPUS),  # GPT-2's vocabulary, held whole on sm_90
    (52225, "corpus", sig.FUSED_CORPUS),  # past it, V % 4 != 0: the narrow kernels' path
])
def test_the_plan_gives_rows_past_8192_to_the_held_kernels_while_they_fit(vocab, mode, region):
    """On a target without clusters (the nv backend's; where a cluster holds the row
    instead: tests/test_cluster.py)."""
    config = bob_config(vocab=vocab, mode=mode, schedule="fused")
    assert config.fused_region(SM90.without_clusters()) == region


@pytest.mark.parametrize("vocab, mode, region", [
    (19456, "corpus", sig.FUSED_HELD_CORPUS),  # held whole in an sm_86 block
    (19460, "corpus", sig.FUSED_STREAM_CORPUS),
    (52224, "corpus", sig.FUSED_STREAM_CORPUS),
    (52228, "hard", sig.FUSED_HELD_HARD),
])
def test_a_target_with_less_shared_memory_holds_shorter_corpus_rows(vocab, mode, region):
    assert bob_config(vocab=vocab, mode=mode, schedule="fused").fused_region(SM86) == region


@pytest.mark.parametrize("vocab, target, grid", [
    (9216, SM90, 132), (32768, SM90, 132), (9216, SM86, 84),
    (9216, SM90.for_device(multiprocessors=114), 114)])
def test_held_launches_take_one_block_per_sm_and_loop_over_rows(vocab, target, grid):
    config = BobConfig(vocab=vocab, prompts=0, updates=3, schedule="fused")
    plan = build_plan(config, target, compiled=stand_in_regions(config, target))
    (held,) = [launch for launch in plan.launches if launch.region == sig.FUSED_HELD_HARD]
    # every update in one launch: a block keeps its row's w for all three
    assert held.label == "fused[0:3]" and config.updates_per_fused_launch(target) == 3
    assert (held.grid.x, held.block.x) == (grid, 512)
    assert certify(plan).holds


def test_a_devices_own_sm_count_changes_the_held_grid_and_nothing_else():
    config = BobConfig(vocab=9216, prompts=1, updates=40, schedule="fused")
    device = SM90.for_device(multiprocessors=78)
    assert device == replace(SM90, multiprocessors=78, cluster_multiprocessors=78)
    assert device.name == SM90.name
    assert SM90.for_device(multiprocessors=SM90.multiprocessors) == SM90
    ours, theirs = build_plan(config, SM90), build_plan(config, device)
    changed = [i for i, (a, b) in enumerate(zip(ours.launches, theirs.launches, strict=True))
               if a != b]
    assert changed and all(ours.launches[i].region == sig.FUSED_HELD_HARD for i in changed)
    assert all(replace(theirs.launches[i], grid=ours.launches[i].grid) == ours.launches[i]
               for i in changed)
    assert dumps(replace(theirs, target=SM90, launches=ours.launches)) == dumps(ours)
    with pytest.raises(ValueError, match="at least one SM"):
        SM90.for_device(multiprocessors=0)


@pytest.mark.parametrize("updates, counts", [
    (70, [32, 32, 6]), (65, [32, 32, 1]), (64, [32, 32]), (32, [32]), (1, [1])])
def test_a_held_launch_runs_at_most_32_updates_and_the_last_the_rest(updates, counts):
    """Each held launch reads and writes w once, and lasts under a second at V = 65536: the
    updates go 32 to a launch, each launch reading its own rows of the AdamW table, and only
    the last writes the gradients and the loss."""
    assert HELD_UPDATES_PER_LAUNCH == 32
    config = BobConfig(vocab=9216, prompts=0, updates=updates, schedule="fused")
    plan = build_plan(config, SM90, compiled=stand_in_regions(config))
    held = [launch for launch in plan.launches if launch.region == sig.FUSED_HELD_HARD]
    names = [p.name for p in plan.region(sig.FUSED_HELD_HARD).params]
    firsts = [sum(counts[:i]) for i in range(len(counts))]
    assert [launch.label for launch in held] == [
        f"fused[{first}]" if count == 1 else f"fused[{first}:{first + count}]"
        for first, count in zip(firsts, counts, strict=True)]
    scalars = plan.tensor(ADAM_SCALARS_TENSOR).address
    for launch, first, count in zip(held, firsts, counts, strict=True):
        args = dict(zip(names, launch.args, strict=True))
        assert args["updates"] == Scalar.u32(count)
        assert args["finish"] == Scalar.u32(int(first + count == updates))
        assert args["adam_scalars"] == Address(scalars + 4 * ADAM_SCALAR_STRIDE * first)
    assert config.training_launches(SM90) == len(counts) + 1  # and the health check
    assert plan.launch_count == config.launch_count(SM90)
    assert certify(plan).holds


@pytest.mark.parametrize("vocab, mode", [(65536, "corpus"), (52225, "corpus")])
def test_rows_past_8192_the_held_kernels_do_not_take_get_a_launch_per_update(vocab, mode):
    """Streamed rows (corpus past what shared memory holds, the stream kernels' or, where
    V % 4 != 0, the narrow ones') keep no part of the row from one update to the next, so
    each update is a launch of its own."""
    config = bob_config(vocab=vocab, prompts=0, updates=3, mode=mode, schedule="fused")
    target = SM90.without_clusters()  # on sm_90 a cluster holds them (tests/test_cluster.py)
    assert config.fused_region(target) not in sig.SHARED_REST
    assert config.updates_per_fused_launch(target) == 1
    assert config.training_launches(target) == 3 + 1  # and the health check


# -- the region: its dynamic shared memory -------------------------------------------------


@pytest.mark.parametrize("arch, target", [("sm_90", SM90), ("sm_86", SM86)])
def test_a_held_region_asks_for_the_shared_memory_its_target_leaves(arch, target):
    regions = compiled(arch)
    for name in sig.SHARED_REST:
        region = regions[name]
        assert region.block_x == 512  # the image's launch bounds
        assert region.dynamic_shared_bytes == sig.shared_rest(target, region.shared_bytes)
        assert region.dynamic_shared_bytes % 1024 == 0
        assert target.max_shared_bytes_per_block - 1024 < region.shared_window_bytes \
            <= target.max_shared_bytes_per_block
        if arch == "sm_90":  # a row of 32768 floats held whole (52224 with NVRTC 13.x)
            assert region.dynamic_shared_bytes // 4 >= 32768
            # what the program sizes corpus rows by before any image exists
            assert region.shared_bytes == sig.HELD_STATIC_SHARED_BYTES
            assert region.dynamic_shared_bytes // 4 == held_to_vocab("corpus", target)
        else:  # sm_86 images leave the reserved KiB out: the program's figure is above theirs
            assert region.shared_bytes <= sig.HELD_STATIC_SHARED_BYTES
            assert region.dynamic_shared_bytes // 4 >= held_to_vocab("corpus", target)
    assert all(regions[name].dynamic_shared_bytes == 0 for name in regions
               if name not in sig.SHARED_REST and name not in sig.CLUSTER_SLICES)


def test_shared_rest_is_what_the_target_leaves_in_whole_kib():
    assert sig.shared_rest(SM90, 22608) == (232448 - 22608) // 1024 * 1024 == 208896
    assert sig.shared_rest(SM86, 200_000) == 0


def test_the_certificate_counts_dynamic_shared_memory():
    config = BobConfig(vocab=9216, prompts=0, updates=1, schedule="fused")
    regions = stand_in_regions(config, shared_bytes=20_000)
    held = regions[sig.FUSED_HELD_HARD]
    fits = SM90.max_shared_bytes_per_block - held.shared_bytes
    regions[sig.FUSED_HELD_HARD] = replace(held, dynamic_shared_bytes=fits)
    assert certify(build_plan(config, SM90, compiled=regions)).holds
    regions[sig.FUSED_HELD_HARD] = replace(held, dynamic_shared_bytes=fits + 4)
    certificate = certify(build_plan(config, SM90, compiled=regions))
    assert certificate.kinds() == {"hardware-limit"}
    assert [str(h) for h in certificate.hazards] == [
        f"hardware-limit: region 'bob-fused-train-held' uses "
        f"{SM90.max_shared_bytes_per_block + 4} bytes of shared memory, sm_90 allows "
        f"{SM90.max_shared_bytes_per_block} per block"]


def test_a_plan_file_states_the_dynamic_shared_memory_and_is_checked_against_the_image(
        tmp_path, capsys):
    pytest.importorskip("cuda.bindings.nvrtc")
    assert main(["plan", "--json", "-V", "9216", "-P", "0", "-N", "1", "--schedule", "fused",
                 "--arch", "sm_90"]) == 0
    text = capsys.readouterr().out
    data = json.loads(text)
    index, held = next((i, r) for i, r in enumerate(data["regions"])
                       if r["name"] == sig.FUSED_HELD_HARD)
    asked = held["dynamic_shared_bytes"]
    assert asked == compiled("sm_90")[sig.FUSED_HELD_HARD].dynamic_shared_bytes > 0
    path = tmp_path / "plan.json"
    data["regions"][index]["dynamic_shared_bytes"] = 1024
    path.write_text(json.dumps(data))
    assert main(["certify", "--plan", str(path)]) != 0
    assert capsys.readouterr().err == (
        f"bob: {path}: regions[{index}]: region 'bob-fused-train-held' differs from Bob's "
        f"own: dynamic_shared_bytes is 1024 in the plan, {asked} in "
        "Bob's sm_90 image\n")
    assert not list(tmp_path.glob("*.npy"))  # nothing but the file we wrote


def test_a_plan_file_without_code_is_checked_against_the_signature():
    """A region without code asks for what its signature says: no dynamic shared memory."""
    config = BobConfig(vocab=9216, prompts=0, updates=1, schedule="fused")
    regions = {name: replace(region, code=b"")
               for name, region in stand_in_regions(config).items()}
    plan = build_plan(config, SM90, compiled=regions)
    data = json.loads(dumps(plan))
    index = next(i for i, r in enumerate(data["regions"]) if r["name"] == sig.FUSED_HELD_HARD)
    assert data["regions"][index]["dynamic_shared_bytes"] == 0
    assert loads(json.dumps(data), regions=catalogue()) == plan
    data["regions"][index]["dynamic_shared_bytes"] = 65536
    with pytest.raises(BadInput, match=rf"regions\[{index}\]: region 'bob-fused-train-held' "
                                       "differs from Bob's own: dynamic_shared_bytes is 65536 "
                                       "in the plan, 0 in Bob's signature"):
        loads(json.dumps(data), regions=catalogue())
    for region in data["regions"]:
        region.pop("dynamic_shared_bytes")  # files from before the field: none asked for
    assert loads(json.dumps(data), regions=catalogue()) == plan


# -- Bob's own stream ---------------------------------------------------------------------


def held_plan(dynamic: int = 65536):
    config = BobConfig(vocab=9216, prompts=0, updates=1, schedule="fused")
    regions = stand_in_regions(config, shared_bytes=4096)
    regions[sig.FUSED_HELD_HARD] = replace(regions[sig.FUSED_HELD_HARD],
                                           dynamic_shared_bytes=dynamic)
    plan = build_plan(config, SM90, compiled=regions)
    index = next(i for i, launch in enumerate(plan.launches)
                 if launch.region == sig.FUSED_HELD_HARD)
    return plan, index


def doing_nothing(plan) -> dict:
    """A kernel for each region that runs, as far as nv-sim's checks go, and does nothing."""
    return {launch.region: (lambda memory, args: None) for launch in plan.launches}


def test_the_qmd_gives_the_block_its_dynamic_shared_memory_and_the_driver_area_says_how_much():
    plan, index = held_plan(65536)
    encoded = encoder.encode(plan)
    record = encoded.qmd_table.data[index * encoded.qmd_stride:][:plan.target.qmd_record_bytes]
    dispatch = decoder.decode_qmd(record, encoded.compute_class).dispatch()
    assert dispatch.shared_memory == 1024 + 4096 + 65536  # system, static, dynamic
    block = encoder.parameter_block(plan, index)
    area = decoder.decode_driver_area(block)
    assert area.dynamic_shared == 65536 == struct.unpack_from("<I", block, 0x2C)[0]
    assert area.stack_top == encoder.STACK_TOP
    other = next(i for i, launch in enumerate(plan.launches) if i != index)
    assert decoder.decode_driver_area(encoder.parameter_block(plan, other)).dynamic_shared == 0


def test_the_listing_shows_the_dynamic_shared_word():
    plan, _ = held_plan(65536)
    listing = decoder.disassemble(encoder.encode(plan), plan)
    assert "+0x02c  dynamic_shared   0x00010000  (driver area)" in listing


def test_the_simulator_refuses_a_launch_short_of_its_shared_memory():
    plan, index = held_plan(65536)
    backend = NvSimBackend(plan, kernels=doing_nothing(plan))
    backend.run(range(plan.submission_count))  # as encoded: every check holds
    _, program = backend._components["program"]
    start = plan.parameter_block_address(index) - plan.address_map.program.base + 0x2C
    program[start:start + 4] = struct.pack("<I", 1024)
    with pytest.raises(NvSimError, match="driver area holds dynamic shared bytes 1024, "
                                         "the launch has 65536"):
        backend.run(range(plan.submission_count))


def test_the_simulator_refuses_a_qmd_short_of_the_regions_shared_memory():
    plan, index = held_plan(65536)
    smaller = replace(plan.region(sig.FUSED_HELD_HARD), dynamic_shared_bytes=0)
    short_plan = replace(plan, regions=tuple(smaller if r.name == smaller.name else r
                                             for r in plan.regions))
    encoded = encoder.encode(short_plan)  # a QMD and driver area for no dynamic bytes
    backend = NvSimBackend(plan, kernels=doing_nothing(plan))
    _, table = backend._components["qmd-table"]
    table[:] = encoded.qmd_table.data
    _, program = backend._components["program"]
    start = plan.parameter_block_address(index) - plan.address_map.program.base + 0x2C
    program[start:start + 4] = struct.pack("<I", 65536)  # the driver area as the plan says
    with pytest.raises(NvSimError, match=f"{1024 + 4096} bytes of shared memory for "
                                         f"bob-fused-train-held, which uses {4096 + 65536}"):
        backend.run(range(plan.submission_count))


def test_every_shape_the_gpu_tests_and_the_bench_try_compiles_without_local_memory():
    """The held kernels' variants (tests/test_held_gpu.py, dev/cuda/bench_stream.py: both
    run on the H200) compile for sm_90 into regions, both modes: no spill, a block from
    their launch bounds. (The shipped kernels: test_a_held_region_asks_for_...)"""
    pytest.importorskip("cuda.bindings.nvrtc", reason="the kernels compile with NVRTC")
    from bob.kernels.cuda.regions import compiled_regions
    from dev.cuda.bench_stream import VARIANTS
    from dev.cuda.variants import knob_source
    from test_held_gpu import SHAPES

    macros_of = {macros: name for name, macros in SHAPES.items()}
    macros_of.update({macros: name for name, (kernels, macros) in VARIANTS.items()
                      if kernels == "held"})
    for macros, name in macros_of.items():
        if not macros:
            continue
        regions = compiled_regions("sm_90", knob_source(macros))
        for region in sig.SHARED_REST:
            assert regions[region].block_x in (512, 768), (name, region)
            assert regions[region].dynamic_shared_bytes > 0, (name, region)
