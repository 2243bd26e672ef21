"""NVRTC compilation and cubin reading: runs without a GPU (NVRTC needs none).

    PYTHONPATH=src python -m pytest tests/test_cuda_compile.py
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

pytest.importorskip("cuda.bindings.nvrtc")

from bob.errors import RunFailure  # noqa: E402
from bob.kernels import signatures as sig  # noqa: E402
from bob.kernels.cuda import compile as nv_compile  # noqa: E402
from bob.kernels.cuda.compile import (  # noqa: E402
    KernelSource,
    NvrtcError,
    cache_key,
    compile_source,
    options_for,
)
from bob.kernels.cuda.cubin import (  # noqa: E402
    EIATTR_PARAM_CBANK,
    EIATTR_REGCOUNT,
    EIFMT_HVAL,
    EIFMT_NVAL,
    EIFMT_SVAL,
    RESERVED_SHARED_BYTES,
    Cubin,
    parse_attributes,
)
from bob.kernels.cuda.regions import (  # noqa: E402
    check_parameter_layout,
    compiled_regions,
    image_regions,
)
from bob.plan.certificate import certify  # noqa: E402
from bob.plan.placement import TARGETS  # noqa: E402
from bob.program.bob import BobConfig, build_plan  # noqa: E402
from dev.cuda.variants import knob_source  # noqa: E402

try:
    NVRTC = nv_compile.nvrtc_version()
except NvrtcError as why:  # the bindings import, but the NVRTC library does not load
    pytest.skip(f"NVRTC is not usable here: {why}", allow_module_level=True)

HERE = Path(__file__).parent / "cuda"
ARCHS = ("sm_86", "sm_90")


def source(name: str) -> KernelSource:
    return KernelSource(name, (HERE / name).read_text())


TEST_KERNELS = source("plan_test_kernels.cu")
STUB = source("bob_signature_stub.cu")


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    return tmp_path / "cubin"


# -- compiling -------------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
def test_compiles_and_reads_each_entry(arch: str, cache: Path) -> None:
    compiled = compile_source(TEST_KERNELS, arch, cache_dir=cache)
    assert compiled.image.startswith(b"\x7fELF")
    assert compiled.options == (*nv_compile.ARITHMETIC_OPTIONS, f"-arch={arch}")
    cubin = Cubin(compiled.image)
    assert cubin.sm == int(arch[3:])
    kernels = cubin.kernels()
    assert set(kernels) == {"test_axpy", "test_reverse", "test_iota"}
    for kernel in kernels.values():
        assert len(kernel.code) > 0 and len(kernel.code) % 16 == 0, kernel.entry
        assert 0 < kernel.registers <= 255, kernel.entry
        assert kernel.parameter_base == TARGETS[arch].parameter_base, kernel.entry
    assert kernels["test_reverse"].static_shared_bytes == 256 * 4
    assert kernels["test_reverse"].reserved_shared_bytes in (0, RESERVED_SHARED_BYTES)
    assert kernels["test_axpy"].shared_bytes == 0
    assert kernels["test_iota"].max_threads == (256, 1, 1)
    # pointers at 0 and 8, then 4-byte scalars: CUDA's layout, the plan's layout
    assert [(p.offset, p.size) for p in kernels["test_axpy"].params] == [
        (0, 8), (8, 8), (16, 4), (20, 4)]
    assert kernels["test_axpy"].parameter_bytes == 24


def test_parameter_bases_are_the_targets() -> None:
    # The seed's figures: Ampere's driver area ends at 0x160, Hopper's at 0x210.
    assert TARGETS["sm_86"].parameter_base == 0x160
    assert TARGETS["sm_90"].parameter_base == 0x210


def test_cache_hits_on_the_second_call(cache: Path) -> None:
    first = compile_source(TEST_KERNELS, "sm_90", cache_dir=cache)
    second = compile_source(TEST_KERNELS, "sm_90", cache_dir=cache)
    assert not first.cached and second.cached
    assert first.image == second.image and first.key == second.key
    assert first.path is not None and first.path.read_bytes() == first.image
    assert list(cache.glob("*.tmp")) == []  # the atomic write left nothing behind


def test_an_unwritable_cache_compiles_and_writes_nothing(cache: Path) -> None:
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text("a file where the cache directory should be")
    compiled = compile_source(TEST_KERNELS, "sm_90", cache_dir=cache)
    assert not compiled.cached and compiled.path is None
    assert compiled.image.startswith(b"\x7fELF")
    assert cache.read_text() == "a file where the cache directory should be"


def test_cache_is_keyed_by_arch_options_source_and_version(cache: Path) -> None:
    sm86 = compile_source(TEST_KERNELS, "sm_86", cache_dir=cache)
    sm90 = compile_source(TEST_KERNELS, "sm_90", cache_dir=cache)
    assert sm86.key != sm90.key and not sm90.cached
    keys = {
        cache_key(TEST_KERNELS, options_for("sm_90"), "sm_90", NVRTC),
        cache_key(TEST_KERNELS, (*options_for("sm_90"), "-lineinfo"), "sm_90", NVRTC),
        cache_key(TEST_KERNELS, options_for("sm_90"), "sm_90", (NVRTC[0], NVRTC[1] + 1)),
        cache_key(KernelSource("k.cu", TEST_KERNELS.text + "\n"), options_for("sm_90"),
                  "sm_90", NVRTC),
        cache_key(KernelSource("k.cu", TEST_KERNELS.text, (("h.cuh", "x"),)),
                  options_for("sm_90"), "sm_90", NVRTC),
    }
    assert len(keys) == 5
    assert sm90.key == cache_key(TEST_KERNELS, options_for("sm_90"), "sm_90", NVRTC)


def test_cache_directory_follows_bob_cache_dir(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BOB_CACHE_DIR", str(tmp_path))
    compiled = compile_source(TEST_KERNELS, "sm_86")
    assert compiled.path is not None and compiled.path.parent == tmp_path / "cubin"
    assert compile_source(TEST_KERNELS, "sm_86").cached


def test_a_damaged_cache_entry_is_recompiled(cache: Path) -> None:
    first = compile_source(TEST_KERNELS, "sm_90", cache_dir=cache)
    assert first.path is not None
    first.path.write_bytes(b"not an image")
    again = compile_source(TEST_KERNELS, "sm_90", cache_dir=cache)
    assert not again.cached and again.image == first.image
    assert first.path.read_bytes() == first.image


def test_compile_error_raises_the_typed_error_with_the_log(cache: Path) -> None:
    broken = KernelSource("broken.cu", 'extern "C" __global__ void f(float* x) { x[0] = ; }\n')
    with pytest.raises(NvrtcError) as caught:
        compile_source(broken, "sm_90", cache_dir=cache)
    error = caught.value
    assert error.call == "nvrtcCompileProgram"
    assert error.status == "NVRTC_ERROR_COMPILATION"
    assert "broken.cu(1)" in error.log and "error" in error.log
    assert error.log.strip() in str(error)
    assert not cache.exists() or list(cache.iterdir()) == []


def test_an_unknown_architecture_is_a_typed_error(cache: Path) -> None:
    with pytest.raises(NvrtcError) as caught:
        compile_source(TEST_KERNELS, "sm_13", cache_dir=cache)
    assert caught.value.status == "NVRTC_ERROR_INVALID_OPTION"


def test_architecture_spellings() -> None:
    assert nv_compile.normalize_arch("90") == "sm_90"
    assert nv_compile.normalize_arch((8, 6)) == "sm_86"
    assert nv_compile.normalize_arch("SM_90") == "sm_90"
    with pytest.raises(ValueError):
        nv_compile.normalize_arch("hopper")


# -- reading Bob's regions -------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
def test_regions_from_an_image_with_bobs_signatures(arch: str, cache: Path) -> None:
    target = TARGETS[arch]
    image = compile_source(STUB, arch, cache_dir=cache).image
    regions = image_regions(image, target)
    assert set(regions) == set(sig.SIGNATURES)
    for name, region in regions.items():
        assert region.entry == sig.ENTRIES[name]
        assert region.params == sig.SIGNATURES[name]
        assert region.block_x == sig.block_of(name)
        assert region.code and 0 < region.registers <= 255
    assert regions[sig.LOSS_HARD].shared_bytes >= 256 * 4
    for config in (BobConfig(vocab=256, prompts=2, updates=2),
                   # corpus with validation: the scatter and the loss alone too
                   BobConfig(vocab=256, prompts=2, updates=2, mode="corpus", pairs=999,
                             validation_pairs=99)):
        plan = build_plan(config, target, compiled=regions)
        assert certify(plan).holds, certify(plan).hazards
        assert all(p.bytes > 0 for p in plan.placed_regions)
        assert {p.name for p in plan.placed_regions} >= (
            {sig.SCATTER, sig.LOSS_ONLY_CORPUS} if config.mode == "corpus" else set())


def test_an_image_for_another_architecture_is_refused(cache: Path) -> None:
    image = compile_source(STUB, "sm_86", cache_dir=cache).image
    with pytest.raises(RunFailure, match="sm_86"):
        image_regions(image, TARGETS["sm_90"])
    kernel = Cubin(image).kernel(sig.ENTRIES[sig.ADAMW])
    with pytest.raises(RunFailure, match="0x160"):
        check_parameter_layout(kernel, TARGETS["sm_90"], sig.SIGNATURES[sig.ADAMW])


def test_a_signature_that_differs_from_the_plan_is_refused(cache: Path) -> None:
    # The argmax with its scalar before its pointers: same bytes, other offsets.
    text = STUB.text.replace(
        "bob_greedy_argmax(unsigned int* prediction, const float* row,\n"
        "                                             unsigned int vocab)",
        "bob_greedy_argmax(unsigned int vocab, unsigned int* prediction, const float* row)")
    assert text != STUB.text
    image = compile_source(KernelSource("swapped.cu", text), "sm_90", cache_dir=cache).image
    with pytest.raises(RunFailure, match="bob_greedy_argmax"):
        image_regions(image, TARGETS["sm_90"])


def test_a_missing_entry_is_named(cache: Path) -> None:
    text = STUB.text.replace("bob_adamw(", "bob_adamw_renamed(")
    image = compile_source(KernelSource("renamed.cu", text), "sm_90", cache_dir=cache).image
    with pytest.raises(RunFailure, match="'bob_adamw'"):
        image_regions(image, TARGETS["sm_90"])


def test_a_kernel_that_needs_local_memory_is_refused(cache: Path) -> None:
    """A stack frame (here a local array indexed at run time) is a resource no region
    declares and Bob's own stream does not provide."""
    body = "    if (threadIdx.x == 0) prediction[0] = row[0] > row[vocab - 1] ? 0u : vocab - 1;"
    spilling = """    volatile float scratch[64];
    for (unsigned int i = 0; i < 64; ++i) scratch[(i * 7u + vocab) % 64u] = row[i];
    prediction[0] = (unsigned int)scratch[vocab % 64u];"""
    text = STUB.text.replace(body, spilling)
    assert text != STUB.text
    image = compile_source(KernelSource("frame.cu", text), "sm_90", cache_dir=cache).image
    with pytest.raises(RunFailure, match=r"'bob_greedy_argmax' needs \d+ bytes of local memory"):
        image_regions(image, TARGETS["sm_90"])


@pytest.mark.parametrize("arch", ARCHS)
def test_the_shipped_kernels(arch: str) -> None:
    """Bob's own kernels: compiled, read, and the image carried with the regions."""
    regions = compiled_regions(arch)
    assert set(regions) == set(sig.SIGNATURES)
    assert Cubin(regions.image).sm == int(arch.removeprefix("sm_"))
    for region in regions.values():
        assert region.code and 0 < region.registers <= 255, region.name
    kernels = Cubin(regions.image).kernels()
    assert all(kernel.frame_bytes == 0 for kernel in kernels.values()), \
        {k.entry: k.frame_bytes for k in kernels.values()}  # composing them checked it too
    plan = build_plan(BobConfig(vocab=256, prompts=2, updates=2), TARGETS[arch],
                      compiled=regions)
    assert certify(plan).holds, certify(plan).hazards


# -- the ELF and .nv.info readers on hand-made bytes ------------------------------------


def test_attribute_records_of_every_format() -> None:
    data = (
        bytes([EIFMT_NVAL, 0x35, 0, 0])
        + bytes([EIFMT_HVAL, 0x19]) + struct.pack("<H", 0x18)
        + bytes([EIFMT_SVAL, EIATTR_PARAM_CBANK]) + struct.pack("<HIHH", 8, 7, 0x210, 0x18)
        + bytes([EIFMT_SVAL, EIATTR_REGCOUNT]) + struct.pack("<HII", 8, 12, 40)
    )
    nval, hval, bank, regs = parse_attributes(data)
    assert nval.value is None and nval.code == 0x35
    assert hval.value == 0x18
    assert bank.value == struct.pack("<IHH", 7, 0x210, 0x18)
    assert regs.words() == (12, 40)


@pytest.mark.parametrize("data, problem", [
    (bytes([EIFMT_SVAL, 0x0A, 8, 0, 1, 2]), "runs past"),
    (bytes([9, 0x0A, 0, 0]), "unknown attribute format"),
    (bytes([EIFMT_HVAL, 0x19]), "truncated"),
])
def test_malformed_attributes_are_refused(data: bytes, problem: str) -> None:
    with pytest.raises(RunFailure, match=problem):
        parse_attributes(data)


def test_a_non_cubin_is_refused() -> None:
    with pytest.raises(RunFailure, match="ELF"):
        Cubin(b"MZ" + bytes(100))
    elf32 = b"\x7fELF" + bytes([1, 1]) + bytes(58)
    with pytest.raises(RunFailure, match="64-bit"):
        Cubin(elf32)


# -- the tuning macros of the knob source (dev/cuda) --------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
def test_the_knob_source_as_it_is_compiles_to_the_shipped_image(arch: str, cache: Path) -> None:
    """Every tuning macro's default is the choice the shipped source has written in: with
    no #defines in front, dev/cuda's knob source gives the shipped cubin byte for byte, so
    a variant differs from the shipped kernels by its macros alone."""
    shipped = compile_source(nv_compile.shipped_source(), arch, cache_dir=cache).image
    assert compile_source(knob_source(), arch, cache_dir=cache).image == shipped


def test_the_shipped_source_has_no_tuning_macro() -> None:
    """Nothing in the shipped kernels can be set from outside: no #ifndef default, no
    #ifdef; the preprocessor tests only the architecture and the tall header's mode."""
    shipped = nv_compile.shipped_source()
    for name, text in ((shipped.name, shipped.text), *shipped.headers):
        tests = [line.strip() for line in text.splitlines()
                 if line.lstrip().startswith(("#if", "#elif"))]
        assert all(test in ("#if __CUDA_ARCH__ >= 900", "#if !TALL_MODE_CORPUS",
                            "#if TALL_MODE_CORPUS") for test in tests), (name, tests)


STREAM_ENTRIES = {sig.ENTRIES[sig.FUSED_STREAM_HARD], sig.ENTRIES[sig.FUSED_STREAM_CORPUS]}


def kernel_codes(arch: str, macros: str) -> dict[str, bytes]:
    """The knob source compiled with `macros` in front, read as regions (which refuses any
    kernel with a stack frame): each entry's code."""
    regions = compiled_regions(arch, knob_source(macros))
    kernels = Cubin(regions.image).kernels()
    assert {k.entry: k.frame_bytes for k in kernels.values() if k.frame_bytes} == {}
    for name in (sig.FUSED_STREAM_HARD, sig.FUSED_STREAM_CORPUS):
        kernel = kernels[sig.ENTRIES[name]]
        assert regions[name].block_x == 256 and kernel.registers <= 64  # 4 blocks per SM
        assert kernel.static_shared_bytes <= 48 * 1024  # static shared memory's limit
    return {k.entry: k.code for k in kernels.values()}


@pytest.mark.parametrize("arch", ARCHS)
def test_stream_vector_on_and_off_compile_without_local_memory(arch: str) -> None:
    """STREAM_VECTOR 1 (rows as float4 quads, the default) and 0 (the narrow kernels'
    scalar streaming) both compile with no local memory, and the macro changes the stream
    kernels' code and no other kernel's."""
    vector = kernel_codes(arch, "#define STREAM_VECTOR 1\n")
    scalar = kernel_codes(arch, "#define STREAM_VECTOR 0\n")
    assert vector == kernel_codes(arch, "")  # 1 is the default
    assert {entry for entry in vector if vector[entry] != scalar[entry]} == STREAM_ENTRIES


FAST_STREAM = "#define STREAM_FAST_DIVIDE 1\n#define STREAM_BOUNDS __launch_bounds__(256, 3)\n"


@pytest.mark.parametrize("arch", ARCHS)
def test_the_stream_fast_divide_variant_compiles_without_local_memory(arch: str) -> None:
    """STREAM_FAST_DIVIDE 1 (a quad's divisions and roots together, not yet the default)
    spills at four blocks per SM (64 registers: refused), and compiles with no local memory
    at three (bench_stream's variant), changing the stream kernels' code and no other's;
    0 is the default."""
    shipped = kernel_codes(arch, "")
    assert shipped == kernel_codes(arch, "#define STREAM_FAST_DIVIDE 0\n")
    with pytest.raises(RunFailure, match="bob_fused_train_stream_corpus.*local memory"):
        kernel_codes(arch, "#define STREAM_FAST_DIVIDE 1\n")
    regions = compiled_regions(arch, knob_source(FAST_STREAM))
    kernels = Cubin(regions.image).kernels()
    assert {k.entry: k.frame_bytes for k in kernels.values() if k.frame_bytes} == {}
    for name in (sig.FUSED_STREAM_HARD, sig.FUSED_STREAM_CORPUS):
        assert kernels[sig.ENTRIES[name]].registers <= 65536 // (256 * 3)
    changed = {entry for entry, kernel in kernels.items() if kernel.code != shipped[entry]}
    assert changed == STREAM_ENTRIES


SEED_ENTRIES = {sig.ENTRIES[sig.LOSS_HARD], sig.ENTRIES[sig.ADAMW]}


@pytest.mark.parametrize("arch", ARCHS)
def test_the_seed_macros_change_the_seed_kernels_and_no_other(arch: str) -> None:
    """The seed schedule's tuning macros (dev/cuda/bench_fused.py --experiments) compile with
    no local memory: SEED_KEPT 2 and SEED_FAST_DIVIDE 1 are the defaults; SEED_KEPT 1
    changes the hard loss-gradient alone; SEED_FAST_DIVIDE 0 (the intrinsics) and
    SEED_LAUNCH_ONLY (empty kernels: the launch floor) change it and AdamW."""
    shipped = kernel_codes(arch, "")
    assert shipped == kernel_codes(arch, "#define SEED_KEPT 2u\n#define SEED_FAST_DIVIDE 1\n")

    def changed(macros: str) -> set[str]:
        codes = kernel_codes(arch, macros)
        return {entry for entry in shipped if codes[entry] != shipped[entry]}

    assert changed("#define SEED_KEPT 1u\n") == {sig.ENTRIES[sig.LOSS_HARD]}
    assert changed("#define SEED_FAST_DIVIDE 0\n") == SEED_ENTRIES
    assert changed("#define SEED_LAUNCH_ONLY 1\n") == SEED_ENTRIES
