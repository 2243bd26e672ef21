"""Bob's own images beside NVRTC's of the same regions, read statically: no GPU needed.

    PYTHONPATH=src:. python3 -m dev.bringup.own_vs_nvrtc [--arch sm_90] [--region NAME]
        [--ordering written|latency]

For each region Bob has own code for: the instructions of each image (less ptxas's
padding after the last EXIT), its registers and shared bytes, and its loops (the bodies
of backward branches, innermost first) with their instruction counts, global loads,
multi-function ops and the sum of the stall counts in their control bits, along the way a
warp takes where every lane's operands are ordinary (own division and square root skip
their exact sequence there: the instructions a VOTE-guarded branch jumps over are left
out; NVRTC's images are read whole, their slow paths being calls outside the loops). The
stall sum is a lower bound on a loop iteration's issue cycles for one warp: scoreboard waits come
on top, and other warps hide them. The loops' stall cycles per global load in them put
the two side by side whatever each unrolls (a row element is read by one load): where
own code spends more fixed stalls per element than ptxas's, a scheduler change can pay;
the GPU (bob profile) says whether it did.

Both images are read through the pinned nvdisasm (``pip install 'bob-bigram[test]'``);
NVRTC's comes from ``bob.kernels.cuda.compile`` (the ``[cuda]`` extra).
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass

from bob.isa import oracle
from bob.isa.builder import ORDERINGS
from bob.isa.control import read_control

BRANCH = re.compile(r"\bBRA\b(?:\s+!?U?P\w+,)?\s+(0x[0-9a-f]+)")
PADDING = {"NOP", "BRA 0x0"}


@dataclass(frozen=True)
class Loop:
    first: int  # instruction index of the branch target
    last: int  # instruction index of the backward branch
    instructions: int
    loads: int  # LDG
    multifunction: int  # MUFU
    stalls: int  # the stall counts' sum


@dataclass(frozen=True)
class Reading:
    instructions: int
    registers: int
    shared_bytes: int
    loops: tuple[Loop, ...]  # innermost first


def stalls_of(code: bytes) -> list[int]:
    return [read_control(int.from_bytes(code[i:i + 16], "little")).stall
            for i in range(0, len(code), 16)]


def read(code: bytes, registers: int, shared_bytes: int, arch: str,
         fast_way: bool = False) -> Reading:
    text = oracle.nvdisasm_raw(code, arch)
    stalls = stalls_of(code)
    end = len(text)
    while end and (text[end - 1] in PADDING or BRANCH.fullmatch(text[end - 1] or "")
                   and int(BRANCH.fullmatch(text[end - 1]).group(1), 16) == 16 * (end - 1)):
        end -= 1
    exact = exact_ways(text[:end]) if fast_way else set()
    loops = []
    for index, line in enumerate(text[:end]):
        found = BRANCH.search(line)
        if found is None:
            continue
        target = int(found.group(1), 16) // 16
        if target > index:
            continue
        taken = [k for k in range(target, index + 1) if k not in exact]
        body = [text[k] for k in taken]
        loops.append(Loop(target, index, len(body),
                          sum(each.split()[0].lstrip("@!P0123456789T ").startswith("LDG")
                              or " LDG" in each for each in body),
                          sum("MUFU" in each for each in body),
                          sum(stalls[k] for k in taken)))
    inner = sorted(loops, key=lambda loop: loop.instructions)
    return Reading(end, registers, shared_bytes, tuple(inner))


def exact_ways(text: list[str]) -> set[int]:
    """The instructions a warp whose lanes all take the fast way skips: those between the
    branch a VOTE's verdict guards (own division and square root: the first branch after
    the VOTE, however the straight run was ordered) and its target."""
    skipped: set[int] = set()
    for index, line in enumerate(text):
        verdict = re.match(r"VOTE\.ANY (P\d),", line)
        if verdict is None:
            continue
        branch = next((k for k in range(index + 1, len(text)) if BRANCH.search(text[k])),
                      None)
        if branch is None or not text[branch].startswith(f"@!{verdict.group(1)} "):
            continue
        target = int(BRANCH.search(text[branch]).group(1), 16) // 16
        skipped.update(range(branch + 1, max(target, branch + 1)))
    return skipped


def stalls_per_load(reading: Reading) -> float | None:
    """The loops' stall cycles per global load in them (None: no loop loads)."""
    loads = sum(loop.loads for loop in reading.loops)
    return sum(loop.stalls for loop in reading.loops) / loads if loads else None


def own_reading(region: str, arch: str, order: str = "written") -> Reading:
    from bob.isa.builder import ordering
    from bob.kernels import own

    with ordering(order):
        image = own.image(region, arch)
    return read(image.code, image.registers, image.shared_bytes, arch, fast_way=True)


def nvrtc_reading(region: str, arch: str) -> Reading:
    from bob.kernels import signatures as sig
    from bob.kernels.cuda.compile import compile_kernels
    from bob.kernels.cuda.cubin import Cubin

    kernel = Cubin(compile_kernels(arch).image).kernel(sig.declared_region(region).entry)
    return read(kernel.code, kernel.registers, kernel.static_shared_bytes, arch)


def describe(reading: Reading) -> str:
    loops = "; ".join(f"{loop.instructions} instr, {loop.loads} LDG, {loop.multifunction} "
                      f"MUFU, {loop.stalls} stall cycles" for loop in reading.loops)
    return (f"{reading.instructions} instructions, {reading.registers} registers, "
            f"{reading.shared_bytes} B shared; loops: {loops or 'none'}")


def main() -> None:
    from bob.kernels import own

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--arch", default="sm_90")
    parser.add_argument("--region", action="append", help="a region (default: every own one)")
    parser.add_argument("--ordering", default="written", choices=ORDERINGS,
                        help="how own code orders its straight runs (bob.isa.builder)")
    args = parser.parse_args()
    for region in args.region or sorted(own.BUILDERS):
        ours = own_reading(region, args.arch, args.ordering)
        theirs = nvrtc_reading(region, args.arch)
        print(f"{region} ({args.arch})")
        print(f"  own:   {describe(ours)}")
        print(f"  nvrtc: {describe(theirs)}")
        mine, nvrtc = stalls_per_load(ours), stalls_per_load(theirs)
        if mine is not None and nvrtc is not None:
            print(f"  loop stall cycles per global load: own {mine:.0f}, nvrtc {nvrtc:.0f}, "
                  f"own/nvrtc {mine / nvrtc:.2f}x; instructions own/nvrtc "
                  f"{ours.instructions / theirs.instructions:.2f}x")


if __name__ == "__main__":
    main()
