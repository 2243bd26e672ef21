"""The health check (bob-health): each table's non-finite elements counted in the plan.

The kernel adds, for parameters, first_moment and second_moment, the count of
elements that are NaN or +-inf into the u64 ``health`` tensor; the host zeroes
it when it loads an invocation and reads its 24 bytes instead of scanning the
tables. Here: the NumPy reference and the Numba path against counts made by
the test itself, every non-finite pattern and the finite edge values; whole
invocations (hard and corpus, seed and fused, cpu reference, cpu fast and
nv-sim) with tables poisoned one at a time (the Numba kernel set runs the NumPy count, which is
already at memory speed); the certificate refusing health
launches that reach too far; the CUDA kernel's PTX; and, marked ``gpu``, the
cuda and nv backends against the CPU.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from bob.backends import BackendChoice, choose_backend
from bob.backends.cpu import CpuBackend
from bob.errors import RunFailure
from bob.host.check import compare_backends, random_record
from bob.host.session import Session, require_finite_counts
from bob.kernels import fast, reference
from bob.kernels import signatures as sig
from bob.kernels.memory import Memory
from bob.plan.certificate import certify
from bob.plan.model import Address, Scalar
from bob.program.bob import HEALTH_TENSOR, BobConfig, Hyper, build_plan
from bob.records.checkpoint import Checkpoint
from conftest import bob_config, needs_nvrtc, shipped_ptx

TABLES = sig.HEALTH_COUNTS  # parameters, first_moment, second_moment
# Every kind of non-finite binary32: +-inf, quiet and signalling NaN, payloads, both signs.
NON_FINITE_BITS = (0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001, 0xFFFFFFFF, 0x7FFFFFFF,
                   0xFFC00000, 0x7FBFFFFF)
# Finite values at the edges of the exponent: the largest, subnormals, zeros.
FINITE_EDGE_BITS = (0x7F7FFFFF, 0xFF7FFFFF, 0x00000001, 0x807FFFFF, 0x80000000, 0x00000000,
                    0x00800000)
KERNEL_SETS = {"reference": reference.KERNELS, "fast": fast.KERNELS}


# -- the kernel over an arena -----------------------------------------------------------------


def health_arena(vocab: int, rng: np.random.Generator, planted: tuple[int, int, int],
                 health_before: tuple[int, int, int] = (0, 0, 0)):
    """Three random tables with `planted[t]` non-finite elements in table t (at distinct
    random places, finite edge values elsewhere among them), and the health counts."""
    count = vocab * vocab
    base, gap = 0x10000, 4096
    addresses = [base + gap + i * (-(-(4 * count + gap) // 4096) * 4096) for i in range(4)]
    buffer = np.zeros(addresses[-1] + gap - base, np.uint8)
    memory = Memory(buffer, base)
    args: dict = {"vocab": vocab}
    for name, address, bad in zip(TABLES, addresses[:3], planted, strict=True):
        args[name] = address
        bits = memory.array(address, "u32", count)
        bits[:] = rng.standard_normal(count, dtype=np.float32).view(np.uint32)
        places = rng.choice(count, size=min(count, bad + len(FINITE_EDGE_BITS)), replace=False)
        bits[places[:bad]] = rng.choice(NON_FINITE_BITS, size=bad)
        bits[places[bad:]] = rng.choice(FINITE_EDGE_BITS, size=places.size - bad)
    args["health"] = addresses[3]
    memory.array(addresses[3], "u32", 6).view(np.uint64)[:] = health_before
    return memory, args


def health_counts(memory: Memory, args: dict) -> list[int]:
    return [int(c) for c in memory.array(int(args["health"]), "u32", 6).view(np.uint64)]


@pytest.mark.parametrize("kernels", sorted(KERNEL_SETS))
@pytest.mark.parametrize("vocab", [2, 3, 17, 256, 300, 1025])
def test_the_kernel_counts_exactly_the_planted_non_finite_elements(kernels, vocab):
    rng = np.random.default_rng(vocab)
    count = vocab * vocab
    planted = (int(rng.integers(0, count // 2 + 1)), 0, count)  # some, none, all of a table
    for order in ((0, 1, 2), (2, 0, 1), (1, 2, 0)):
        wanted = tuple(planted[i] for i in order)
        memory, args = health_arena(vocab, rng, wanted)
        before = memory.buffer.copy()
        KERNEL_SETS[kernels][sig.HEALTH](memory, args)
        assert health_counts(memory, args) == list(wanted)
        # the tables are only read: every byte outside health is as it was
        health = int(args["health"]) - memory.base
        changed = np.nonzero(memory.buffer != before)[0]
        assert ((changed >= health) & (changed < health + 24)).all()


@pytest.mark.parametrize("kernels", sorted(KERNEL_SETS))
def test_the_kernel_adds_modulo_two_to_the_64_as_the_device_atomics_do(kernels):
    rng = np.random.default_rng(1)
    top = 2**64 - 1
    memory, args = health_arena(40, rng, (3, 5, 0), health_before=(top, 7, top))
    KERNEL_SETS[kernels][sig.HEALTH](memory, args)
    assert health_counts(memory, args) == [2, 12, top]


# -- whole invocations -------------------------------------------------------------------------


BACKENDS = {
    "cpu-reference": lambda: replace(choose_backend("cpu"),
                                     opener=lambda plan: CpuBackend(plan, reference.KERNELS)),
    "cpu-fast": lambda: choose_backend("cpu"),
    # the command stream: the encoder's QMDs and parameter blocks, decoded and run
    "nv-sim": lambda: choose_backend("nv-sim"),
}
LOSS_MESSAGE = "the loss became non-finite"
TABLE_MESSAGE = ("the table became non-finite by step 3; the last good checkpoint is kept "
                 "(try a smaller --lr)")
# (table, value planted, what the host may say): NaN in the parameters reaches the loss;
# inf in the first moment drives parameters to -inf, which the hard loss survives unless
# the target's column is hit; inf in the second moment only makes AdamW's steps zero, so
# the loss stays finite and only the health check sees it.
POISONS = [
    ("parameters", np.float32(np.nan), (LOSS_MESSAGE,)),
    ("first_moment", np.float32(np.inf), (LOSS_MESSAGE, TABLE_MESSAGE)),
    ("second_moment", np.float32(np.inf), (TABLE_MESSAGE,)),
]


def poisoned_checkpoint(config: BobConfig, table: str | None, value: np.float32,
                        places: int) -> Checkpoint:
    rng = np.random.default_rng(config.vocab)
    start = Checkpoint.zeros(config.vocab, Hyper(), config.mode)
    start = replace(start, parameters=rng.standard_normal((config.vocab,) * 2, np.float32))
    if table is None:
        return start
    poisoned = getattr(start, table).copy()
    flat = poisoned.reshape(-1)
    # the first and last elements, and others at random
    flat[[0, flat.size - 1, *rng.choice(flat.size - 2, places - 2, replace=False) + 1]] = value
    return replace(start, **{table: poisoned})


def invoke(backend: str, config: BobConfig, checkpoint: Checkpoint):
    """One training invocation; the health bytes and table counts it left, and its error."""
    with Session(BACKENDS[backend]()) as session:
        error = None
        try:
            session.invoke(config, checkpoint, random_record(config, 2), "train")
        except RunFailure as raised:
            error = str(raised)
        arena = session.last_backend
        assert arena is not None
        counted = [int(np.count_nonzero(~np.isfinite(np.frombuffer(arena.read_tensor(name),
                                                                   np.float32))))
                   for name in TABLES]
        return arena.read_tensor(HEALTH_TENSOR), counted, error


@pytest.mark.parametrize("schedule", ["seed", "fused"])
@pytest.mark.parametrize("mode", ["hard", "corpus"])
@pytest.mark.parametrize("poison", [None, *POISONS], ids=lambda p: p and p[0] or "finite")
def test_every_backend_writes_the_health_of_the_tables_it_leaves(schedule, mode, poison):
    config = bob_config(vocab=37, prompts=1, updates=3, mode=mode, schedule=schedule)
    table, value, message = poison or (None, np.float32(0), None)
    checkpoint = poisoned_checkpoint(config, table, value, places=5)
    results = {backend: invoke(backend, config, checkpoint) for backend in BACKENDS}
    health, counted, error = results["cpu-reference"]
    for backend, result in results.items():
        assert result == results["cpu-reference"], backend  # byte for byte, same error
    assert np.frombuffer(health, np.uint64).tolist() == counted
    if table is None:
        assert counted == [0, 0, 0] and error is None
    else:
        assert error is not None and error.startswith(message), error
        assert counted[TABLES.index(table)] >= 5
    if table == "second_moment":  # the health check alone caught it: exactly the planted
        assert counted == [0, 0, 5]


@pytest.mark.parametrize("schedule", ["seed", "fused"])
def test_the_health_check_ends_the_chained_training_submission(schedule):
    """Chained: the health launch is the last of the training chain, on nv-sim as on the cpu."""
    config = BobConfig(vocab=20, prompts=2, updates=3, schedule=schedule, submission="chained")
    plan = build_plan(config)
    training = plan.submissions[1]
    assert plan.launches[training.launches[-1]].region == sig.HEALTH
    checkpoint = poisoned_checkpoint(config, "second_moment", np.float32(np.inf), places=3)
    results = {backend: invoke(backend, config, checkpoint) for backend in BACKENDS}
    for result in results.values():
        assert result == results["cpu-fast"]
    health, counted, error = results["cpu-fast"]
    assert np.frombuffer(health, np.uint64).tolist() == counted == [0, 0, 3]
    assert error == TABLE_MESSAGE


def test_a_second_invocation_starts_from_zero_counts():
    """The host zeroes health when it loads: the counts are one invocation's, not a sum."""
    config = BobConfig(vocab=16, prompts=0, updates=2)
    checkpoint = poisoned_checkpoint(config, "second_moment", np.float32(np.inf), places=4)
    with Session(choose_backend("cpu")) as session:
        for _ in range(2):
            with pytest.raises(RunFailure, match="the table became non-finite by step 2"):
                session.invoke(config, checkpoint, random_record(config, 1), "train")
            health = session.last_backend.read_tensor(HEALTH_TENSOR)
            assert np.frombuffer(health, np.uint64).tolist() == [0, 0, 4]


def test_the_finiteness_check_is_decided_by_the_health_bytes():
    require_finite_counts(np.array([0, 0, 0], np.uint64).tobytes(), 7)
    for counts in ([1, 0, 0], [0, 2**40, 0], [0, 0, 1]):
        with pytest.raises(RunFailure, match=r"^the table became non-finite by step 7; the "
                                                r"last good checkpoint is kept \(try a smaller "
                                                r"--lr\)$"):
            require_finite_counts(np.array(counts, np.uint64).tobytes(), 7)


# -- the plan and its certificate ---------------------------------------------------------------


def health_launch(plan):
    (index,) = [i for i, launch in enumerate(plan.launches) if launch.region == sig.HEALTH]
    return index, plan.launches[index]


def with_argument(plan, name: str, value):
    index, launch = health_launch(plan)
    names = [p.name for p in plan.region(sig.HEALTH).params]
    args = list(launch.args)
    args[names.index(name)] = value
    launches = list(plan.launches)
    launches[index] = replace(launch, args=tuple(args))
    return replace(plan, launches=tuple(launches))


@pytest.mark.parametrize("schedule", ["seed", "fused"])
@pytest.mark.parametrize("updates", [0, 1, 4])
def test_the_health_check_ends_every_training_invocation(schedule, updates):
    config = BobConfig(vocab=300, prompts=2, updates=updates, schedule=schedule)
    plan = build_plan(config)
    regions = [launch.region for launch in plan.launches]
    assert regions.count(sig.HEALTH) == int(updates > 0) == config.health_launches
    assert plan.tensor(HEALTH_TENSOR).bytes == 24
    if updates:
        index, launch = health_launch(plan)
        assert index == plan.launch_count - 1  # after the last update, in a train submission
        assert index >= plan.forward_launches
        args = dict(zip([p.name for p in plan.region(sig.HEALTH).params], launch.args,
                        strict=True))
        assert args["vocab"] == Scalar.u32(300)
        assert args["health"] == Address(plan.tensor(HEALTH_TENSOR).address)
        for name in TABLES:
            assert args[name] == Address(plan.tensor(name).address)
        assert certify(plan).holds, certify(plan).hazards


def test_the_certificate_refuses_a_health_launch_reaching_too_far():
    plan = build_plan(BobConfig(vocab=64, prompts=1, updates=2))
    assert certify(plan).holds
    health = plan.tensor(HEALTH_TENSOR).address
    second = plan.tensor("second_moment").address

    hazards = certify(with_argument(plan, "vocab", Scalar.u32(65))).hazards
    assert {h.kind for h in hazards} == {"footprint-overflow"}
    assert {h.argument for h in hazards} == set(TABLES)

    hazards = certify(with_argument(plan, "health", Address(health + 8))).hazards
    assert [(h.kind, h.argument, h.tensor) for h in hazards] == [
        ("footprint-overflow", "health", HEALTH_TENSOR)]

    hazards = certify(with_argument(plan, "health", Address(health - 4096))).hazards
    assert hazards and {h.argument for h in hazards} == {"health"}

    # 16-byte loads: a table four bytes on is misaligned (and reaches past its tensor)
    hazards = certify(with_argument(plan, "second_moment", Address(second + 4))).hazards
    assert {(h.kind, h.argument) for h in hazards} == {
        ("misaligned", "second_moment"), ("footprint-overflow", "second_moment")}


def test_the_health_signature_reads_the_tables_and_only_adds_to_health():
    params = {p.name: p for p in sig.SIGNATURES[sig.HEALTH] if hasattr(p, "access")}
    assert {name: p.access for name, p in params.items()} == {
        "parameters": "read", "first_moment": "read", "second_moment": "read",
        "health": "readwrite"}
    assert params["health"].footprint.evaluate({}) == 24 and params["health"].align == 8
    assert all(params[name].align == 16 for name in TABLES)


# -- the CUDA kernel ---------------------------------------------------------------------------


@needs_nvrtc
@pytest.mark.parametrize("arch", ["sm_86", "sm_90"])
def test_the_cuda_kernel_is_one_vectorized_pass_with_64_bit_atomics(arch):
    from bob.kernels.cuda.compile import compile_source, shipped_source
    from bob.kernels.cuda.cubin import Cubin

    compiled = compile_source(shipped_source(), arch)
    kernel = Cubin(compiled.image).kernel(sig.ENTRIES[sig.HEALTH])
    assert kernel.code and kernel.registers <= 64
    ptx = shipped_ptx(arch)
    start = ptx.index(f".entry {sig.ENTRIES[sig.HEALTH]}(")
    body = ptx[start:ptx.find(".entry", start + 1)]
    assert "ld.global.v4" in body  # four floats per load
    assert "atom.global.add.u64" in body  # 64-bit counts
    assert "setp.lt.u64" in body or "setp.ge.u64" in body  # 64-bit loop bounds


# -- on a GPU: cuda and nv against the CPU ------------------------------------------------------


def gpu_against_cpu(choice: BackendChoice, config: BobConfig) -> None:
    for poison in (None, *POISONS):
        table, value, _ = poison or (None, np.float32(0), None)
        checkpoint = poisoned_checkpoint(config, table, value, places=9)
        record = random_record(config, 4)
        arenas = []
        errors = []
        for session_choice in (choose_backend("cpu"), choice):
            session = Session(session_choice)
            try:
                session.invoke(config, checkpoint, record, "train")
                errors.append(None)
            except RunFailure as error:
                errors.append(str(error))
            arenas.append(session)
        try:
            cpu, gpu_backend = (s.last_backend for s in arenas)
            assert errors[0] == errors[1]
            assert cpu.read_tensor(HEALTH_TENSOR) == gpu_backend.read_tensor(HEALTH_TENSOR)
            assert compare_backends(cpu, gpu_backend, 0) is None
        finally:
            for session in arenas:
                session.close()


GPU_CASES = [(vocab, mode, schedule) for vocab in (3, 256, 1025, 8192)
             for mode in ("hard", "corpus") for schedule in ("seed", "fused")]


@pytest.mark.gpu
@pytest.mark.parametrize("vocab,mode,schedule", GPU_CASES)
def test_health_on_cuda_equals_the_cpu(cuda_choice, vocab, mode, schedule):
    config = bob_config(vocab=vocab, prompts=1, updates=2, mode=mode, schedule=schedule)
    gpu_against_cpu(cuda_choice, config)


@pytest.mark.gpu
@pytest.mark.parametrize("vocab,mode,schedule", GPU_CASES)
def test_health_on_nv_equals_the_cpu(vocab, mode, schedule):
    from test_nv_rm import _nv_present

    if not _nv_present():
        pytest.skip("no NVIDIA kernel driver here")
    pytest.importorskip("cuda.bindings.nvrtc", reason="the nv backend compiles with NVRTC")
    config = bob_config(vocab=vocab, prompts=1, updates=2, mode=mode, schedule=schedule)
    gpu_against_cpu(choose_backend("nv"), config)


@pytest.mark.gpu
def test_health_on_cuda_counts_past_two_to_the_32_elements(cuda_choice):
    """V = 65536 (beyond Bob's MAX_VOCAB, the kernel's own limit): each table is 2^32
    elements, 16 GiB; non-finite values planted at the first, 2^31-th and last elements must
    all be found. 48 GiB of arena: an H200-sized test."""
    import time

    from bob.plan.certificate import require_certified
    from bob.plan.model import Dim3, LaunchSpec, ProgramSpec, Submission, TensorRef, TensorSpec
    from bob.plan.placement import place
    from bob.program.bob import health_grid

    vocab = 65536
    count = vocab * vocab
    tensors = (*(TensorSpec(name, "f32", (vocab, vocab)) for name in TABLES),
               TensorSpec(HEALTH_TENSOR, "u32", (3, 2)))
    launch = LaunchSpec(sig.HEALTH, Dim3(health_grid(count)), Dim3(sig.BLOCK),
                        (*(TensorRef(name) for name in TABLES), TensorRef(HEALTH_TENSOR),
                         Scalar.u32(vocab)), "health")
    plan = place(ProgramSpec((cuda_choice.regions[sig.HEALTH],), tensors, (launch,),
                             (Submission(0, 1, 1),)), cuda_choice.target)
    planted = {"parameters": {count - 1: np.nan},
               "first_moment": {2**31: np.inf, 2**31 + 1: -np.inf, 2**32 - 5: np.nan},
               "second_moment": {0: np.nan, 2**31 - 1: np.inf}}
    backend = cuda_choice.open(require_certified(plan))
    try:
        backend.write_tensor(HEALTH_TENSOR, bytes(24))
        for name, values in planted.items():
            for index, value in values.items():
                backend.write_tensor(name, np.float32(value).tobytes(), offset=4 * index)
        start = time.perf_counter()
        backend.run(range(1))
        seconds = time.perf_counter() - start
        counts = np.frombuffer(backend.read_tensor(HEALTH_TENSOR), np.uint64).tolist()
    finally:
        backend.close()
    assert counts == [len(planted[name]) for name in TABLES]
    print(f"bob-health over 3 x 2^32 floats: {seconds * 1e3:.1f} ms, "
          f"{3 * 4 * count / seconds / 1e12:.2f} TB/s (first run, with launch set-up)")


def test_every_kernel_waits_for_the_launches_before_it_first():
    """The cuda backend joins graph nodes by programmatic edges (sm_90): a kernel that does
    not wait first could read the tables before the last update has written them."""
    import re

    from bob.kernels.cuda.compile import shipped_source

    shipped = shipped_source()  # bob_kernels.cu and the headers it includes (bob_tall.cuh)
    code = re.sub(r"//[^\n]*", "", "\n".join([shipped.text, *(t for _, t in shipped.headers)]))
    for entry in sig.ENTRIES.values():
        found = re.search(r'extern "C" __global__ (?:\w+ )?void ' + entry + r"\([^)]*\)\s*\{"
                          r"\s*([^;]*);", code)
        assert found, entry
        assert found.group(1).strip() == "wait_for_prerequisites()", entry
