"""What the bob.isa tests share: the oracles (skipped with the reason where missing),
the NVRTC images of Bob's kernels, and the seed kernels' names."""

from __future__ import annotations

import functools

import pytest

from bob.isa import oracle

ARCHS = ("sm_90", "sm_86")
SEED_KERNELS = ("bob_row_gather", "bob_loss_gradient_hard", "bob_adamw", "bob_greedy_argmax")


def require_tool(name: str) -> None:
    """Skip (printing why) where the pinned wheel's tool is missing or does not run."""
    try:
        path = oracle.tool_path(name)
        oracle.run_tool(name, "--version", timeout=60)
    except (oracle.OracleMissing, RuntimeError) as error:
        print(f"skipping: {error}")
        pytest.skip(f"{name} unavailable: {error}")
    print(f"{name}: {path}")


@functools.cache
def _image(arch: str) -> bytes | str:
    from bob.errors import BobError
    from bob.kernels.cuda.compile import compile_kernels

    try:
        return compile_kernels(arch).image
    except BobError as error:
        return str(error)


def kernel_image(arch: str) -> bytes:
    """Bob's kernels compiled by NVRTC (through its cache); skip where NVRTC is missing."""
    image = _image(arch)
    if isinstance(image, str):
        print(f"skipping: NVRTC cannot compile the kernels: {image}")
        pytest.skip(f"NVRTC unavailable: {image}")
    return image
