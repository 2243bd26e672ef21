"""The copy kernels the nv backend takes read-back snapshots with (compiled by NVRTC, which
needs no GPU); their launches are checked in tests/test_nv_stream.py."""

from __future__ import annotations

import pytest

from bob.errors import RunFailure
from bob.kernels.cuda.cubin import Kernel, KernelParam
from bob.kernels.cuda.snapshot import UNITS, check_copy_kernel, choose, copy_kernels
from conftest import needs_nvrtc


@needs_nvrtc
def test_the_copy_kernels_compile_with_three_8_byte_parameters_and_no_stack():
    kernels = copy_kernels("sm_90")
    assert set(kernels) == {"bob_copy_16", "bob_copy_4"}
    for entry, copy in kernels.items():
        kernel = copy.kernel
        assert copy.unit == UNITS[entry] and kernel.code and kernel.registers > 0
        assert kernel.parameter_base == 0x210 and kernel.frame_bytes == 0
        assert [(p.offset, p.size) for p in kernel.params] == [(0, 8), (8, 8), (16, 8)]
        assert kernel.max_threads == (256, 1, 1)


def _kernel(params, frame_bytes=0, shared_bytes=0) -> Kernel:
    return Kernel("bob_copy_16", b"\0" * 16, 16, shared_bytes, 0x210, 24,
                  tuple(KernelParam(i, offset, size) for i, (offset, size) in enumerate(params)),
                  frame_bytes=frame_bytes)


def test_a_copy_kernel_with_another_layout_or_a_stack_is_refused():
    check_copy_kernel(_kernel([(0, 8), (8, 8), (16, 8)]))
    with pytest.raises(RunFailure, match=r"takes \[\(0, 8\), \(8, 8\), \(16, 4\)\]"):
        check_copy_kernel(_kernel([(0, 8), (8, 8), (16, 4)]))
    with pytest.raises(RunFailure, match="needs local or shared memory"):
        check_copy_kernel(_kernel([(0, 8), (8, 8), (16, 8)], frame_bytes=16))
    with pytest.raises(RunFailure, match="needs local or shared memory"):
        check_copy_kernel(_kernel([(0, 8), (8, 8), (16, 8)], shared_bytes=1024))


def test_the_wide_kernel_takes_16_byte_aligned_copies_the_narrow_one_the_rest():
    assert choose(0x1000, 0x2000, 4096) == "bob_copy_16"
    assert choose(0x1004, 0x2000, 4096) == "bob_copy_4"
    assert choose(0x1000, 0x2000, 4100) == "bob_copy_4"
    with pytest.raises(ValueError, match="whole 4-byte words: 4098 bytes from 0x1000"):
        choose(0x1000, 0x2000, 4098)
    with pytest.raises(ValueError, match="from 0x1002 to 0x2000"):
        choose(0x1002, 0x2000, 4096)
