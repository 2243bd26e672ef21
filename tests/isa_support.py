"""What the bob.isa tests share: the oracles (skipped with the reason where missing),
the NVRTC images of Bob's kernels, and the seed kernels' names."""

from __future__ import annotations

import functools

import pytest

from bob.isa import oracle

ARCHS = ("sm_90", "sm_86")
SEED_KERNELS = ("bob_row_gather", "bob_loss_gradient_hard", "bob_adamw", "bob_greedy_argmax")


def assert_printed_as_nvdisasm_prints(images, arch: str) -> None:
    """Each image's instructions render as the pinned nvdisasm prints them, and each
    instruction's bytes decode and encode back to themselves."""
    from bob.isa import codec, table, text

    require_tool("nvdisasm")
    forms = table(arch)
    for image in images:
        printed = oracle.nvdisasm_raw(image.code, arch)
        assert len(printed) == len(image.instructions)
        for index, (instruction, want) in enumerate(zip(image.instructions, printed,
                                                        strict=True)):
            assert text.render(instruction, forms, index * 16) == want, (image.name, index)
            raw = image.code[index * 16:index * 16 + 16]
            assert codec.encode(codec.decode(raw, forms), forms) == raw


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
