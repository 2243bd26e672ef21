"""The probe's stage 4: Bob's plan through ``NvBackend`` and the CPU backend, compared.

Every tensor is compared bit for bit after running all submissions once; the
first difference of each differing tensor is printed with both values.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import numpy as np

from bob.backends.cpu import CpuBackend
from bob.backends.nv.rm.backend import NvBackend
from bob.backends.nv.rm.ioctl import Transport
from bob.errors import RunFailure
from bob.host.check import first_difference
from bob.kernels.cuda.regions import load_regions
from bob.plan.certificate import require_certified
from bob.plan.placement import SM90
from bob.program.bob import BobConfig, build_plan

Say = Callable[[str], None]


def _inputs(vocab: int, prompts: int, mode: str) -> Mapping[str, bytes]:
    """Random targets (hard) or corpus weights, prompts, and a random table."""
    rng = np.random.default_rng(7)
    if mode == "hard":
        targets = rng.integers(0, vocab, vocab, dtype=np.uint32).tobytes()
    else:  # corpus weights: a random distribution over transitions
        weights = rng.random(vocab * vocab)
        targets = (weights / weights.sum()).astype(np.float32).tobytes()
    record = targets + rng.integers(0, vocab, prompts, dtype=np.uint32).tobytes()
    table = (rng.standard_normal(vocab * vocab) * 0.5).astype(np.float32).tobytes()
    return {"input": record, "parameters": table}


def run_plan_check(deadline_s: float = 10.0, regions_path: str | None = None,
                   vocab: int = 256, prompts: int = 2, updates: int = 3, mode: str = "hard",
                   say: Say = print, transport: Transport | None = None) -> None:
    """Bob's plan on the GPU and on the CPU backend, every tensor compared bit for bit.

    `transport` replaces the device files (a scripted driver, in tests)."""
    config = BobConfig(vocab=vocab, prompts=prompts, updates=updates, mode=mode)
    plan = require_certified(build_plan(config, SM90, compiled=load_regions(regions_path)))
    placed = plan.plan
    say(f"plan: V={vocab} P={prompts} N={updates} {mode}: {placed.launch_count} launches, "
        f"{placed.submission_count} submissions, program {placed.program_bytes} bytes, "
        f"arena {placed.arena_bytes} bytes at 0x{placed.address_map.arena.base:x}")
    began = time.monotonic()
    with CpuBackend(plan) as cpu, NvBackend(plan, deadline_s=deadline_s,
                                                      transport=transport) as nv:
        say(f"NvBackend opened in {(time.monotonic() - began) * 1e3:.1f} ms")
        say("uploaded, read back from the GPU's memory: " + ", ".join(
            f"{name} {size} bytes {'= encode(plan)' if same else 'DIFFERS from encode(plan)'}"
            for name, size, same in _read_back(nv)))
        for backend in (cpu, nv):
            for name, data in _inputs(vocab, prompts, mode).items():
                backend.write_tensor(name, data)
        timings = {}
        for backend in (cpu, nv):
            began = time.monotonic()
            backend.run(range(placed.submission_count))
            timings[backend.name] = (time.monotonic() - began) * 1e3
        say("run all submissions: " + ", ".join(
            f"{name} {ms:.2f} ms" for name, ms in timings.items())
            + (f"; nv per AdamW update {timings['nv'] * 1e3 / updates:.1f} us "
               "(update = AdamW + loss-gradient, each submitted alone)" if updates else ""))
        mismatches = _compare(placed, cpu, nv, say)
        last = placed.submission_count - 1
        say(f"semaphores: submission {last}'s slot = {nv.semaphore(last)} (plan: "
            f"{placed.submissions[last].semaphore}); launch progress = {nv.launch_progress()}")
        predictions = np.frombuffer(nv.read_tensor("predictions"), np.uint32)
        say(f"predictions (nv): {predictions.tolist()}; "
            f"{'all tensors bit-identical' if not mismatches else f'{mismatches} differ'}")
    if mismatches:
        raise RunFailure(f"{mismatches} tensors differ between nv and cpu")


def _compare(plan, cpu: CpuBackend, nv: NvBackend, say: Say) -> int:
    """Print each tensor's verdict; the number that differ."""
    mismatches = 0
    for tensor in plan.tensors:
        expected, found = cpu.read_tensor(tensor.name), nv.read_tensor(tensor.name)
        difference = first_difference(tensor, expected, found, invocation=0)
        if difference is None:
            say(f"  {tensor.name}: {len(expected)} bytes identical")
            continue
        mismatches += 1
        want, got = difference.values
        say(f"  {tensor.name}: DIFFERS, first at {list(difference.index)}: cpu {want!r}, "
            f"nv {got!r} ({difference.differing_elements} elements differ)")
    return mismatches


def _read_back(backend: NvBackend) -> list[tuple[str, int, bool]]:
    """Each encoded component as the GPU's memory holds it, against the encoder's bytes."""
    found = []
    for encoded in backend.encoded.components:
        if encoded.base is None:
            continue
        block = backend.blocks[encoded.name]
        assert block.gpu_va is not None
        data = block.read(encoded.base - block.gpu_va, len(encoded.data))
        found.append((encoded.name, len(data), data == encoded.data))
    return found
