"""The small-row fused path's variants (the knob source, dev/cuda/bob_kernels.cu:
SMALL_THREADS, SMALL_FAST_DIVIDE, SMALL_FULL_ROWS; the list is dev/cuda/bench_small.py's):
each compiles for sm_90 with no local memory and changes only the kernels built on
fused_train (NVRTC, no GPU); on a GPU (marked ``gpu``) each trains byte for byte as the
CPU does.

    PYTHONPATH=src python -m pytest tests/test_small_variants.py
    PYTHONPATH=src python -m pytest -m gpu tests/test_small_variants.py   # on a GPU machine
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from bob.backends import BackendChoice, choose_backend
from bob.host.check import compare_backends, random_record
from bob.host.session import Session, split_updates
from bob.kernels import signatures as sig
from bob.plan.certificate import certify
from bob.program.bob import BobConfig, Hyper
from bob.records.checkpoint import Checkpoint
from conftest import bob_config
from dev.cuda.bench_small import VARIANTS
from dev.cuda.variants import knob_source, variant_choice

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = "128 threads, fast divide, full rows (default)"
NARROW_ENTRIES = {sig.ENTRIES[sig.FUSED_HARD], sig.ENTRIES[sig.FUSED_CORPUS]}
# Every kernel built on fused_train holds the small path (the wide ones never run it: the
# plan gives them V > 1024), so the macros reach these four and no other.
FUSED_TRAIN_ENTRIES = NARROW_ENTRIES | {sig.ENTRIES[sig.FUSED_WIDE_HARD],
                                        sig.ENTRIES[sig.FUSED_WIDE_CORPUS]}
REGISTERS_PER_SM = 65536


# -- compiling (NVRTC, no GPU) ---------------------------------------------------------


@pytest.fixture(scope="module")
def shipped_kernels():
    pytest.importorskip("cuda.bindings.nvrtc")
    from bob.kernels.cuda.cubin import Cubin
    from bob.kernels.cuda.regions import compiled_regions

    return Cubin(compiled_regions("sm_90").image).kernels()


def test_the_default_variant_is_the_knob_source_as_it_is() -> None:
    assert VARIANTS[DEFAULT] == ""  # the shipped kernels' bytes: test_cuda_compile.py
    assert len(set(VARIANTS.values())) == len(VARIANTS)  # no variant measured twice


@pytest.mark.parametrize("name", [name for name in VARIANTS if name != DEFAULT])
def test_each_variant_compiles_without_local_memory_and_changes_only_the_fused_train_kernels(
        name: str, shipped_kernels) -> None:
    from bob.kernels.cuda.cubin import Cubin
    from bob.kernels.cuda.regions import compiled_regions

    # compiled_regions refuses any kernel with a stack frame (check_no_local_memory)
    regions = compiled_regions("sm_90", knob_source(VARIANTS[name]))
    kernels = Cubin(regions.image).kernels()
    assert {k.entry: k.frame_bytes for k in kernels.values() if k.frame_bytes} == {}
    changed = {entry for entry, kernel in kernels.items()
               if kernel.code != shipped_kernels[entry].code}
    assert changed == FUSED_TRAIN_ENTRIES, name  # live there, nowhere else
    for region in (sig.FUSED_HARD, sig.FUSED_CORPUS):
        kernel = kernels[sig.ENTRIES[region]]
        assert regions[region].block_x == 256  # the plan's block: the variants keep it
        # the narrow kernels' launch bounds leave at least two blocks of 256 on an SM
        assert 2 * 256 * kernel.registers <= REGISTERS_PER_SM, (name, kernel.registers)
        assert kernel.static_shared_bytes <= 48 * 1024


def test_a_thread_count_outside_32_64_128_does_not_compile(tmp_path: Path) -> None:
    pytest.importorskip("cuda.bindings.nvrtc")
    from bob.kernels.cuda.compile import NvrtcError, compile_source

    with pytest.raises(NvrtcError) as caught:
        compile_source(knob_source("#define SMALL_THREADS 16u\n"), "sm_90",
                       cache_dir=tmp_path)
    assert "SMALL_THREADS must be 128, 64 or 32" in caught.value.log


# -- the bench script on the cpu backend -----------------------------------------------


def run_bench(*env: str) -> subprocess.CompletedProcess:
    environment = dict(arg.split("=", 1) for arg in env)
    return subprocess.run([sys.executable, "-m", "dev.cuda.bench_small"],
                          env={**os.environ, "PYTHONPATH": "src", **environment},
                          cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_the_bench_runs_on_the_cpu_and_agrees_with_itself() -> None:
    result = run_bench("B=cpu", "VS=3", "N=2")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    timed = [line for line in lines if "us/update" in line]
    checked = [line for line in lines if "cpu " in line]
    assert [line.split(":")[0] for line in timed] == [
        "V=3 hard N=2 shipped", "V=3 corpus N=2 shipped"]
    assert len(checked) == 2 and all(line.endswith(": identical") for line in checked)


@pytest.mark.parametrize("env, message", [
    (("VS=1",), "VS must lie in [2, 256] and N be >= 1, not VS=1 N=1000"),
    (("VS=300",), "VS must lie in [2, 256] and N be >= 1, not VS=300 N=1000"),
    (("N=0",), "VS must lie in [2, 256] and N be >= 1, not VS=256,255,128 N=0"),
    (("VS=two",), "VS and N must be integers: invalid literal for int() with base 10: 'two'"),
    (("B=nope", "VS=4"), "unknown backend 'nope'; choose one of"),
])
def test_bad_settings_are_one_line_and_status_2(env: tuple[str, ...], message: str) -> None:
    result = run_bench(*env)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.startswith(f"bench_small: {message}")
    assert len(result.stderr.splitlines()) == 1 and "Traceback" not in result.stderr


# -- on the GPU: every variant byte for byte as the CPU --------------------------------


def start_table(vocab: int) -> np.ndarray:
    """Standard normal rows, and rows that take the kernels' rarer ways: row 0 all equal (a
    zero maximum: the literal max tree); row 1 spread over 300 (exponentials that underflow
    to subnormals and zero: the fast division's fallback); row 2 tiny (1e-30)."""
    table = np.random.default_rng(vocab).standard_normal((vocab, vocab), dtype=np.float32)
    table[0] = 0.0
    if vocab > 2:
        table[1] = np.linspace(-300.0, 0.0, vocab, dtype=np.float32)
        table[2] = np.float32(1e-30) * table[2]
    return table


def train_both(cuda: BackendChoice, config: BobConfig, steps: int) -> None:
    """`steps` updates in invocations of config.updates: seed on the CPU, fused on the GPU;
    every tensor compared after each invocation."""
    record = random_record(config, 14)
    start = replace(Checkpoint.zeros(config.vocab, Hyper(), config.mode),
                    parameters=start_table(config.vocab))
    states = [start, start]
    seed_config, fused_config = (replace(config, schedule=s) for s in ("seed", "fused"))
    with Session(choose_backend("cpu")) as cpu, Session(cuda) as gpu:
        assert certify(gpu.plan_for(fused_config)).holds
        for number, updates in enumerate(split_updates(steps, config.updates)):
            for i, (session, schedule_config) in enumerate(((cpu, seed_config),
                                                            (gpu, fused_config))):
                states[i] = session.invoke(replace(schedule_config, updates=updates),
                                           states[i], record, "train").checkpoint
            assert cpu.last_backend is not None and gpu.last_backend is not None
            difference = compare_backends(cpu.last_backend, gpu.last_backend, number)
            assert difference is None, f"{config}: {difference}"


@pytest.fixture(scope="module")
def variant_choices(cuda_arch: str) -> dict[str, BackendChoice]:
    return {name: variant_choice(macros) for name, macros in VARIANTS.items()}


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["hard", "corpus"])
@pytest.mark.parametrize("vocab", [256, 255, 100, 2])
@pytest.mark.parametrize("name", list(VARIANTS))
def test_each_variant_on_the_gpu_equals_the_cpu(variant_choices, name: str, vocab: int,
                                                mode: str) -> None:
    """12 updates in invocations of 9 and 3: staged AdamW scalars across chunks (4 rows a
    chunk on 32 threads), and a second launch starting from the first one's state."""
    config = bob_config(vocab=vocab, prompts=1, updates=9, mode=mode)
    train_both(variant_choices[name], config, 12)


# -- on the GPU: the fast division and root (quotient_fast, root_fast) against the intrinsics

# Test kernels compiled after Bob's source, so they call its helpers. The root: every
# binary32 in the range root_fast_applies admits (1.9e9 values), against __fsqrt_rn, and
# the range's two neighbours refused. The quotient: pseudo-random pairs with both operands
# moderate (random sign, exponent and mantissa; a quarter with the divisor's mantissa near
# all ones, a quarter near 1), against __fdiv_rn. result[0] counts the differences,
# result[1] holds one of them (root: x; quotient: a's bits << 32 | b's).
FAST_PATH_KERNELS = r"""
static __device__ u32 mix(u32 x) {
    x ^= x >> 16; x *= 0x7FEB352Du; x ^= x >> 15; x *= 0x846CA68Bu; x ^= x >> 16;
    return x;
}
static __device__ float moderate_float(u32 mantissa, u32 r) {
    const u32 biased = 67u + (r >> 1) % 120u;  // [67, 186]: moderate()'s range
    return __int_as_float((int)((r << 31) | (biased << 23) | (mantissa & 0x7FFFFFu)));
}
static __device__ void note(unsigned long long* result, unsigned long long bad,
                            unsigned long long witness) {
    if (bad == 0) return;
    atomicAdd(result, bad);
    atomicExch(result + 1, witness);
}
extern "C" __global__ void test_root_fast(unsigned long long* result) {
    const u32 count = 0x7F7FFFFFu - 0x0D000000u + 1u;
    unsigned long long bad = 0, witness = 0;
    for (u32 k = blockIdx.x * blockDim.x + threadIdx.x; k < count; k += gridDim.x * blockDim.x) {
        const float x = __int_as_float((int)(0x0D000000u + k));
        if (!root_fast_applies(x) ||
            __float_as_int(root_fast(x)) != __float_as_int(__fsqrt_rn(x))) {
            ++bad;
            witness = 0x0D000000u + k;
        }
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        const u32 outside[4] = {0x0CFFFFFFu, 0x7F800000u, 0x80000000u, 0x7FC00000u};
        for (u32 i = 0; i < 4; ++i) {
            if (root_fast_applies(__int_as_float((int)outside[i]))) {
                ++bad;
                witness = outside[i];
            }
        }
    }
    note(result, bad, witness);
}
extern "C" __global__ void test_quotient_fast(unsigned long long* result, u32 seed,
                                              u32 per_thread) {
    const u32 id = blockIdx.x * blockDim.x + threadIdx.x;
    unsigned long long bad = 0, witness = 0;
    for (u32 i = 0; i < per_thread; ++i) {
        const u32 r1 = mix(seed ^ mix(id) ^ mix(i + 0x9E3779B9u)), r2 = mix(r1);
        const u32 r3 = mix(r2), r4 = mix(r3);
        u32 divisor_mantissa = r3;
        if (i % 4 == 0) divisor_mantissa = 0x7FFFFFu - (r3 & 0xFFFu);
        if (i % 4 == 1) divisor_mantissa = r3 & 0xFFFu;
        const float a = moderate_float(r1, r2), b = moderate_float(divisor_mantissa, r4);
        if (!moderate(a) || !moderate(b) ||
            __float_as_int(quotient_fast(a, b)) != __float_as_int(dvd(a, b))) {
            ++bad;
            witness = (unsigned long long)(u32)__float_as_int(a) << 32 | (u32)__float_as_int(b);
        }
    }
    note(result, bad, witness);
}
"""
BLOCKS, THREADS = 2112, 256  # 16 blocks of 256 per SM of an H200
QUOTIENT_PAIRS_PER_THREAD = 1 << 15  # 1.8e10 pairs


def run_fast_path_kernel(arch: str, entry: str, *scalars: int) -> tuple[int, int]:
    """One launch of a test kernel through libcuda (ctypes): its two result words."""
    import ctypes

    from bob.kernels.cuda.compile import KernelSource, compile_source, shipped_source

    shipped = shipped_source()
    source = KernelSource("fast_paths.cu", shipped.text + FAST_PATH_KERNELS, shipped.headers)
    image = compile_source(source, arch).image
    cuda = ctypes.CDLL("libcuda.so.1")

    def call(name: str, *args) -> None:
        status = getattr(cuda, name)(*args)
        assert status == 0, f"{name}: CUresult {status}"

    device, context = ctypes.c_int(), ctypes.c_void_p()
    module, function, memory = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_uint64()
    call("cuInit", 0)
    call("cuDeviceGet", ctypes.byref(device), 0)
    call("cuDevicePrimaryCtxRetain", ctypes.byref(context), device)
    try:
        call("cuCtxSetCurrent", context)
        call("cuModuleLoadData", ctypes.byref(module), ctypes.c_char_p(image))
        call("cuModuleGetFunction", ctypes.byref(function), module, entry.encode())
        call("cuMemAlloc_v2", ctypes.byref(memory), ctypes.c_size_t(16))
        call("cuMemsetD8_v2", memory, ctypes.c_ubyte(0), ctypes.c_size_t(16))
        values = [ctypes.c_uint64(memory.value), *(ctypes.c_uint32(s) for s in scalars)]
        params = (ctypes.c_void_p * len(values))(
            *(ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in values))
        cuda.cuLaunchKernel.argtypes = (ctypes.c_void_p, *(ctypes.c_uint,) * 7,
                                        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
        call("cuLaunchKernel", function, BLOCKS, 1, 1, THREADS, 1, 1, 0, None,
             ctypes.cast(params, ctypes.c_void_p), None)
        call("cuCtxSynchronize")
        words = (ctypes.c_uint64 * 2)()
        call("cuMemcpyDtoH_v2", words, memory, ctypes.c_size_t(16))
        call("cuMemFree_v2", memory)
        call("cuModuleUnload", module)
    finally:
        release = getattr(cuda, "cuDevicePrimaryCtxRelease_v2", None)
        (release or cuda.cuDevicePrimaryCtxRelease)(device)
    return int(words[0]), int(words[1])


@pytest.mark.gpu
def test_the_fast_root_is_the_intrinsic_over_its_whole_range(cuda_arch: str) -> None:
    bad, witness = run_fast_path_kernel(cuda_arch, "test_root_fast")
    assert bad == 0, f"{bad} differ, e.g. x = 0x{witness:08x}"


@pytest.mark.gpu
@pytest.mark.parametrize("seed", [1, 2])
def test_the_fast_quotient_is_the_intrinsic_on_moderate_operands(cuda_arch: str,
                                                                 seed: int) -> None:
    bad, witness = run_fast_path_kernel(cuda_arch, "test_quotient_fast", seed,
                                        QUOTIENT_PAIRS_PER_THREAD)
    assert bad == 0, (f"{bad} differ, e.g. a = 0x{witness >> 32:08x}, "
                      f"b = 0x{witness & 0xFFFFFFFF:08x}")
