"""The tall kernels' tuning macros (the knob source, dev/cuda/bob_kernels.cu and
bob_tall.cuh: TALL_<MODE>_THREADS, TALL_<MODE>_UNGUARDED per mode; TALL_HOLD_WEIGHTS,
TALL_CORPUS_FULL, TALL_EVERY_WARP_TREE, TALL_REGISTER_CHAIN for both), as
dev/cuda/bench_tall.py compiles them.

    .venv/bin/python -m pytest -q tests/test_tall_variants.py              # NVRTC, no GPU
    PYTHONPATH=src python -m pytest -m gpu tests/test_tall_variants.py      # on a GPU machine

Without a GPU: every variant compiles for sm_90 with no stack frame, within the registers
its launch bounds allow, and plans with the block its image names; the macros' defaults
are the shipped image; bench_tall's logic runs on the cpu backend. On a GPU: each variant
byte-identical to the CPU at V = 4608 and 8192, hard and corpus.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import bob.kernels.signatures as sig
import bob.program.bob as program
from bob.errors import BadInput, RunFailure
from bob.program.bob import BobConfig, build_plan
from conftest import bob_config
from dev.cuda import bench_tall
from dev.cuda.variants import knob_source, variant_choice

TALL = (sig.FUSED_TALL_HARD, sig.FUSED_TALL_CORPUS)
TALL_ENTRIES = {sig.ENTRIES[name] for name in TALL}
REGISTER_FILE = 65536  # 32-bit registers per SM (sm_90): a block of B threads gets 65536 / B
STATIC_SHARED_LIMIT = 48 * 1024


@pytest.fixture(scope="module")
def nvrtc() -> None:
    pytest.importorskip("cuda.bindings.nvrtc")
    from bob.kernels.cuda import compile as nv_compile

    try:
        nv_compile.nvrtc_version()
    except nv_compile.NvrtcError as why:
        pytest.skip(f"NVRTC is not usable here: {why}")


def compiled(macros: str, arch: str = "sm_90"):
    """The knob source's regions compiled with `macros` in front (refusing any stack
    frame), and the image's kernels by entry."""
    from bob.kernels.cuda.cubin import Cubin
    from bob.kernels.cuda.regions import compiled_regions

    regions = compiled_regions(arch, knob_source(macros))
    return regions, Cubin(regions.image).kernels()


def threads_of(macros: str, region: str) -> int:
    """The block a mode's tall kernel has with these #defines (bench_tall.both's form)."""
    mode = "CORPUS" if region == sig.FUSED_TALL_CORPUS else "HARD"
    for threads in (512, 1024):
        if f"TALL_{mode}_THREADS {threads}u" in macros:
            return threads
    return sig.TALL_BLOCKS[region]


# -- every variant compiles within its resources ---------------------------------------


@pytest.mark.parametrize("name", list(bench_tall.VARIANTS))
def test_each_variant_compiles_without_local_memory_within_its_registers(
        nvrtc: None, name: str) -> None:
    macros = bench_tall.VARIANTS[name]
    regions, kernels = compiled(macros)  # compiled_regions refuses a stack frame
    assert {k.entry: k.frame_bytes for k in kernels.values() if k.frame_bytes} == {}
    for region_name in TALL:
        threads = threads_of(macros, region_name)
        kernel = kernels[sig.ENTRIES[region_name]]
        assert kernel.max_threads == (threads, 1, 1), kernel.max_threads
        assert regions[region_name].block_x == threads  # the plan launches the image's block
        assert kernel.registers <= min(255, REGISTER_FILE // threads), kernel.registers
        assert kernel.static_shared_bytes <= STATIC_SHARED_LIMIT
        assert regions[region_name].registers == kernel.registers
        assert regions[region_name].shared_bytes == kernel.shared_bytes


@pytest.mark.parametrize("name", list(bench_tall.VARIANTS)[1:])
def test_a_variant_changes_the_tall_kernels_and_no_other(nvrtc: None, name: str) -> None:
    _, shipped = compiled("")
    _, variant = compiled(bench_tall.VARIANTS[name])
    changed = {entry for entry in shipped if shipped[entry].code != variant[entry].code}
    assert changed and changed <= TALL_ENTRIES


def test_the_macros_defaults_are_the_shipped_image(nvrtc: None) -> None:
    defaults = ("#define TALL_HARD_THREADS 1024u\n#define TALL_HARD_UNGUARDED 1\n"
                "#define TALL_CORPUS_THREADS 512u\n#define TALL_CORPUS_UNGUARDED 0\n"
                "#define TALL_EVERY_WARP_TREE 0\n")
    _, shipped = compiled("")
    _, spelled = compiled(defaults)
    assert {e: k.code for e, k in shipped.items()} == {e: k.code for e, k in spelled.items()}


def test_the_shipped_tall_block_is_the_declared_one(nvrtc: None) -> None:
    """Changing a mode's tall block in the shipped bob_kernels.cu needs
    signatures.TALL_BLOCKS to follow (plans without an image, exported regions files of
    old): this says so."""
    from bob.kernels.cuda.cubin import Cubin
    from bob.kernels.cuda.regions import compiled_regions

    regions = compiled_regions("sm_90")
    kernels = Cubin(regions.image).kernels()
    for name in TALL:
        assert regions[name].block_x == sig.block_of(name) == sig.TALL_BLOCKS[name]
        assert kernels[sig.ENTRIES[name]].max_threads == (sig.TALL_BLOCKS[name], 1, 1)


def test_a_full_corpus_path_at_1024_threads_is_refused_for_its_spill(nvrtc: None) -> None:
    """Why TALL_CORPUS_FULL is off at 1024 threads: ptxas spills, and regions refuse it."""
    with pytest.raises(RunFailure, match="bob_fused_train_tall_corpus.*local memory"):
        compiled("#define TALL_CORPUS_THREADS 1024u\n#define TALL_CORPUS_FULL 1\n")


@pytest.mark.parametrize("mode", ["hard", "corpus"])
def test_a_1024_thread_variant_plans_and_certifies_with_its_block(nvrtc: None,
                                                                  mode: str) -> None:
    from bob.plan.certificate import certify
    from bob.plan.placement import TARGETS

    regions, _ = compiled(bench_tall.both(1024))
    config = bob_config(vocab=8192, prompts=1, updates=3, mode=mode, schedule="fused")
    plan = build_plan(config, TARGETS["sm_90"], compiled=regions)
    region = config.fused_region(plan.target)
    fused = [launch for launch in plan.launches if launch.region == region]
    assert fused and all(launch.block.x == 1024 for launch in fused)
    assert all(launch.block.x == 256 for launch in plan.launches if launch.region != region)
    assert certify(plan).holds, certify(plan).hazards


def test_a_declared_block_the_image_forbids_is_refused(nvrtc: None) -> None:
    """Outside BLOCK_FROM_IMAGE the declared block stands: a kernel bounded to 512 threads
    under a region declared at 1024 is refused, never launched wrongly."""
    from bob.kernels.cuda.regions import region_from_kernel
    from bob.plan.placement import TARGETS

    _, kernels = compiled("#define TALL_HARD_THREADS 512u\n")
    declared = sig.declared_region(sig.FUSED_TALL_HARD, block_x=1024)
    outside = sig.declared_region(sig.FUSED_HARD, block_x=1024)
    kernel = kernels[sig.ENTRIES[sig.FUSED_TALL_HARD]]
    assert region_from_kernel(kernel, declared, TARGETS["sm_90"]).block_x == 512
    with pytest.raises(RunFailure, match="allows 512 threads per block, the plan launches 1024"):
        region_from_kernel(kernel, outside, TARGETS["sm_90"])  # the same signature


# -- exported regions carry their blocks ------------------------------------------------


def regions_file(tmp_path: Path, entry: dict) -> Path:
    from bob.kernels.cuda.regions import REGIONS_FORMAT, REGIONS_VERSION

    path = tmp_path / "regions.json"
    path.write_text(json.dumps({"format": REGIONS_FORMAT, "version": REGIONS_VERSION,
                                "arch": "sm_90", "regions": {sig.FUSED_TALL_HARD: entry}}))
    return path


def test_a_regions_file_carries_the_block(tmp_path: Path) -> None:
    from bob.kernels.cuda.regions import load_regions

    entry = {"code": "00ff", "registers": 128, "shared_bytes": 40016}
    old = load_regions(regions_file(tmp_path, entry))
    assert old[sig.FUSED_TALL_HARD].block_x == sig.TALL_BLOCKS[sig.FUSED_TALL_HARD]  # no block
    new = load_regions(regions_file(tmp_path, {**entry, "block_x": 512}))
    assert new[sig.FUSED_TALL_HARD].block_x == 512


@pytest.mark.parametrize("block", [0, 2048, "512", True, 1.5])
def test_a_bad_block_in_a_regions_file_is_one_line(tmp_path: Path, block: object) -> None:
    from bob.kernels.cuda.regions import load_regions

    path = regions_file(tmp_path, {"code": "00", "registers": 1, "shared_bytes": 0,
                                   "block_x": block})
    with pytest.raises(BadInput) as caught:
        load_regions(path)
    assert str(caught.value) == (f"{path}: region {sig.FUSED_TALL_HARD}: block_x must be an "
                                 f"integer in [1, 1024], not {block!r}")


def test_an_exported_regions_file_round_trips_the_blocks(nvrtc: None, tmp_path: Path) -> None:
    from bob.kernels.cuda.regions import export_regions, load_regions

    exported = export_regions(tmp_path / "regions.json")
    loaded = load_regions(tmp_path / "regions.json")
    assert {n: r.block_x for n, r in loaded.items()} == \
        {n: r.block_x for n, r in exported.items()}


# -- bench_tall's logic on the cpu backend ----------------------------------------------


def test_bench_tall_runs_on_the_cpu_backend(monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("B", "cpu")
    monkeypatch.setenv("VS", "40")
    monkeypatch.setenv("CHECK_VS", "40")
    monkeypatch.setenv("N", "2")
    monkeypatch.setattr("sys.argv", ["bench_tall.py"])
    shipped_start = dict(program.TALL_FROM_VOCAB)
    assert bench_tall.main() == 0
    assert program.TALL_FROM_VOCAB == shipped_start  # the check's override is undone
    lines = capsys.readouterr().out.splitlines()
    timed = [line for line in lines if "us/update" in line]
    assert [line.split()[1] for line in timed] == ["hard", "corpus"]
    checked = [line for line in lines if line.endswith("= cpu")]
    assert len(checked) == 2 and all("bob-fused-train-tall" in line for line in checked)
    assert not any("DIFFERS" in line for line in lines)


def test_bench_tall_variants_need_cuda(monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("B", "cpu")
    monkeypatch.setattr("sys.argv", ["bench_tall.py", "--variants"])
    assert bench_tall.main() == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == "--variants needs B=cuda: the variants are CUDA kernels\n"


def test_a_differing_digest_is_named() -> None:
    run = bench_tall.TallRun(BobConfig(vocab=40, prompts=0, updates=2, schedule="fused"),
                             None, "abc", sig.FUSED_TALL_HARD, 512)
    assert run.line("x", "abc").endswith("state abc = cpu")
    assert run.line("x", "def").endswith("state abc DIFFERS from cpu def")


# -- on the GPU: each variant's bytes are the CPU's --------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(bench_tall.VARIANTS))
@pytest.mark.parametrize("mode", ["hard", "corpus"])
@pytest.mark.parametrize("vocab", [4608, 8192])
def test_each_variant_equals_the_seed_on_the_cpu(monkeypatch: pytest.MonkeyPatch, name: str,
                                                  mode: str, vocab: int) -> None:
    """Three updates: an invocation of two (every update in one launch) then one, from a
    random table with a row of zeros (the literal max's fallback), against the seed."""
    from test_fused_gpu import train_both

    monkeypatch.setattr(program, "TALL_FROM_VOCAB", {"hard": 4608, "corpus": 4608})
    choice = variant_choice(bench_tall.VARIANTS[name])
    config = bob_config(vocab=vocab, prompts=1, updates=2, mode=mode)
    region = config.fused_region(choice.target)
    assert region in TALL
    assert choice.regions[region].block_x == threads_of(bench_tall.VARIANTS[name], region)
    train_both(choice, config, 3)
