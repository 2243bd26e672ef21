"""Differential checking: the same invocations on two backends, compared byte for byte.

After every invocation every tensor of the arena is compared; the first
difference is reported with the tensor, the element index and both values.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from bob.backends import Backend, choose_backend
from bob.backends.registry import OWN_KERNEL_BACKENDS, require_kernels
from bob.config import DEFAULT_KERNELS, DEFAULT_TARGET
from bob.host import own_code
from bob.host.session import Session, split_updates
from bob.plan.model import Plan
from bob.program.bob import CORPUS_TENSORS, HEALTH_TENSOR, TENSOR_NAMES, BobConfig, Hyper
from bob.records.binary import InputRecord
from bob.records.checkpoint import Checkpoint

_DTYPES = {"f32": np.float32, "u32": np.uint32, "u8": np.uint8}
# The seed's nine tensors and the health check's counts: every tensor a kernel writes in
# hard mode, and the inputs.
COMPARED = (*TENSOR_NAMES, HEALTH_TENSOR)
# What corpus mode adds to them: the tables the scatters write, the validation input and
# the validation losses.
CORPUS_COMPARED = CORPUS_TENSORS


def compared_tensors(plan: Plan) -> tuple[str, ...]:
    """The tensors a check compares in `plan`: COMPARED and those of CORPUS_COMPARED it has
    (the fused schedule's AdamW scalars are the host's, the same on every backend)."""
    names = {tensor.name for tensor in plan.tensors}
    return (*TENSOR_NAMES, *(name for name in CORPUS_COMPARED if name in names), HEALTH_TENSOR)


@dataclass(frozen=True)
class Difference:
    invocation: int
    tensor: str
    index: tuple[int, ...]
    values: tuple[object, object]
    differing_elements: int

    def __str__(self) -> str:
        a, b = self.values
        return (f"invocation {self.invocation}: tensor {self.tensor!r} first differs at "
                f"{list(self.index)}: {a!r} vs {b!r} ({self.differing_elements} elements "
                "differ)")


@dataclass(frozen=True)
class CheckReport:
    backends: tuple[str, str]
    invocations: int
    tensors_compared: int
    bytes_compared: int
    difference: Difference | None

    @property
    def identical(self) -> bool:
        return self.difference is None


def first_difference(plan_tensor, a: bytes, b: bytes, invocation: int) -> Difference | None:
    """Where two copies of a tensor first differ, element-wise, or None."""
    if a == b:
        return None
    dtype = _DTYPES[plan_tensor.dtype]
    left = np.frombuffer(a, dtype).reshape(plan_tensor.shape)
    right = np.frombuffer(b, dtype).reshape(plan_tensor.shape)
    differ = left.view(np.uint8 if dtype == np.uint8 else np.uint32) != \
        right.view(np.uint8 if dtype == np.uint8 else np.uint32)
    index = tuple(int(i) for i in np.argwhere(differ)[0])
    return Difference(invocation, plan_tensor.name, index,
                      (left[index].item(), right[index].item()), int(differ.sum()))


def compare_backends(left: Backend, right: Backend, invocation: int) -> Difference | None:
    for name in compared_tensors(left.plan):
        difference = first_difference(left.plan.tensor(name), left.read_tensor(name),
                                      right.read_tensor(name), invocation)
        if difference is not None:
            return difference
    return None


def random_record(config: BobConfig, seed: int) -> InputRecord:
    """Input for a check: random targets, or `config.pairs` random corpus pairs (the first
    cell always among them) with weights from counts 1 .. 49, and prompts."""
    rng = np.random.default_rng(seed)
    v = config.vocab
    prompts = rng.integers(0, v, config.prompts, dtype=np.uint32)
    if config.mode == "hard":
        return InputRecord.hard(rng.integers(0, v, v, dtype=np.uint32), prompts, source="check")
    keys = np.unique(np.concatenate([[0], rng.choice(v * v, config.pairs, replace=False)]))
    keys = keys[:config.pairs].astype(np.uint64)
    counts = rng.integers(1, 50, keys.size).astype(np.float64)
    return InputRecord.sparse(v, keys, (counts / counts.sum()).astype(np.float32), prompts,
                              source="check")


def differential_check(backend_names: tuple[str, str], config: BobConfig, steps: int,
                       seed: int = 0, hyper: Hyper = Hyper(), arch: str = DEFAULT_TARGET,
                       arenas: tuple[str, str] = ("device", "device"),
                       kernels: str = DEFAULT_KERNELS) -> CheckReport:
    """Train `steps` updates in invocations of `config.updates` on both backends; with
    ``kernels="own"`` the nv or nv-sim among them runs Bob's own kernels (the other may be
    cpu, the oracle)."""
    require_kernels(kernels, backend_names)
    choices = [choose_backend(name, arch=arch, arena=arena,
                              kernels=kernels if name in OWN_KERNEL_BACKENDS
                              else DEFAULT_KERNELS)
               for name, arena in zip(backend_names, arenas, strict=True)]
    for choice in choices:  # Bob's own code runs the plan (nv without NVRTC too)
        own_code.require_covered(choice, config)
    record = random_record(config, seed)
    sessions = [Session(choice, hyper) for choice in choices]
    states = [Checkpoint.zeros(config.vocab, hyper, config.mode)] * 2
    compared = bytes_compared = 0
    try:
        for number, updates in enumerate(split_updates(steps, max(config.updates, 1)) or [0]):
            step_config = replace(config, updates=updates)
            operation = "train" if updates else "predict"
            for i, session in enumerate(sessions):
                states[i] = session.invoke(step_config, states[i], record, operation).checkpoint
            backends = [session.last_backend for session in sessions]
            difference = compare_backends(backends[0], backends[1], number)
            names = compared_tensors(backends[0].plan)
            compared += len(names)
            bytes_compared += sum(backends[0].plan.tensor(n).bytes for n in names)
            if difference is not None:
                return CheckReport(backend_names, number + 1, compared, bytes_compared,
                                   difference)
        return CheckReport(backend_names, number + 1, compared, bytes_compared, None)
    finally:
        for session in sessions:
            session.close()
