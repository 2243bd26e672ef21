"""A test-only region that traps on request, and one-launch plans of it.

Not in Bob's program catalogue: only tests build it. The kernel writes
``out[i] = magic + i`` like the bring-up probe, except that with ``magic ==
TRAP_MAGIC`` thread 0 executes ``__trap()`` first, which stops the grid with
an illegal-instruction fault. So the same compiled region gives a faulting
launch and a good one, and a test can check the next backend works.
"""

from __future__ import annotations

from bob.kernels.cuda.compile import KernelSource
from bob.kernels.cuda.regions import CompiledRegions, compiled_regions
from bob.plan.model import (
    Dim3,
    Footprint,
    LaunchSpec,
    Plan,
    PointerParam,
    ProgramSpec,
    Region,
    Scalar,
    ScalarParam,
    Submission,
    TensorRef,
    TensorSpec,
)
from bob.plan.placement import TARGETS, place

TRAP_MAGIC = 0xDEAD_0000
BLOCK = 128
SOURCE = KernelSource("bob-test-trap", (
    'extern "C" __global__ void bob_test_trap(unsigned int *out, unsigned int magic)\n'
    "{\n"
    "    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    if (magic == 0xDEAD0000u && i == 0) {\n"
    "        __trap();\n"
    "    }\n"
    "    out[i] = magic + i;\n"
    "}\n"
))
DECLARED = Region("test-trap", block_x=BLOCK, entry="bob_test_trap", params=(
    PointerParam("out", Footprint(4, ("grid.x", "block.x")), "write"),
    ScalarParam("magic", "u32"),
))


def trap_regions(arch: str = "sm_90") -> CompiledRegions:
    """The trap region compiled with NVRTC for `arch` (cached like Bob's kernels)."""
    return compiled_regions(arch, SOURCE, [DECLARED])


def one_launch_plan(region: Region, magic: int, blocks: int = 4, arch: str = "sm_90",
                    launches: int = 1) -> Plan:
    """`launches` launches of `region` over one tensor "out", each its own submission."""
    elements = blocks * BLOCK
    program = ProgramSpec(
        regions=(region,),
        tensors=(TensorSpec("out", "u32", (elements,)),),
        launches=tuple(LaunchSpec(region.name, Dim3(blocks), Dim3(BLOCK),
                                  (TensorRef("out"), Scalar.u32(magic)), f"trap-test-{k}")
                       for k in range(launches)),
        submissions=tuple(Submission(k, 1, k + 1) for k in range(launches)),
    )
    return place(program, TARGETS[arch])


def expected_out(magic: int, blocks: int = 4) -> list[int]:
    return [(magic + i) % 2**32 for i in range(blocks * BLOCK)]
