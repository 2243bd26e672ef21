"""Which part of an own image faults on the GPU: one-launch plans of variants, in turn.

    PYTHONPATH=src:.:tests python3 -m dev.bringup.own_ladder [-V 256]

Each variant is a region's own image changed in one way (cut after k instructions and
ended with EXIT, the trap check taken out, every instruction given the longest stall and
every wait, the system's shared KiB counted), or NVRTC's image with the own image's
resources. Each runs alone on the nv backend (tests/own_launch.py's plan and inputs); a
fault is printed and the next variant runs. Full images are compared with the reference
(nv-sim on the own image); a cut image only has to finish.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import replace

from bob.isa import table as arch_table
from bob.isa.builder import ALL_BOARDS, tail
from bob.isa.codec import encode
from bob.isa.control import LONGEST_YIELDING_STALL
from bob.isa.model import Instruction
from bob.plan.model import Region
from bob.plan.placement import SM90

Transform = Callable[[list[Instruction]], list[Instruction]]


def body_of(instructions: tuple[Instruction, ...]) -> list[Instruction]:
    """The instructions up to and including the last EXIT (the tail left off)."""
    last = max(i for i, each in enumerate(instructions) if each.form == "EXIT")
    return list(instructions[:last + 1])


def cut(k: int) -> Transform:
    def apply(body: list[Instruction]) -> list[Instruction]:
        exit_ = next(each for each in body if each.form == "EXIT")
        return [*body[:k], replace(exit_, control=replace(exit_.control, wait=ALL_BOARDS))]
    return apply


def without_trap(body: list[Instruction]) -> list[Instruction]:
    return [Instruction("NOP", (), (), control=each.control) if each.form == "BPT.TRAP"
            else each for each in body]


BRANCHES = ("BRA", "EXIT", "BPT")


def slowest(body: list[Instruction]) -> list[Instruction]:
    def stall(each: Instruction) -> int:
        return each.control.stall if each.form.startswith(BRANCHES) else LONGEST_YIELDING_STALL
    return [replace(each, control=replace(each.control, stall=stall(each), wait=ALL_BOARDS))
            for each in body]


def yield_off(body: list[Instruction]) -> list[Instruction]:
    return [replace(each, control=replace(each.control, yield_bit=False)) for each in body]


# ptxas starts every sm_90 kernel with ACQBULK (outside Bob's subset): its word as
# nvdisasm reads it from ptxas's row gather, for the variant that starts the same way.
ACQBULK = (0x000FE20000000000_000000000000782E).to_bytes(16, "little")


def encoded(body: list[Instruction], prefix: bytes = b"") -> bytes:
    table = arch_table("sm_90")
    count = len(body) + len(prefix) // 16
    return prefix + b"".join(encode(each, table) for each in body + tail(count))


def variant(region: Region, instructions, *transforms: Transform, prefix: bytes = b"",
            **resources) -> Region:
    body = body_of(instructions)
    for transform in transforms:
        body = transform(body)
    return replace(region, code=encoded(body, prefix), **resources)


def run(region: Region, vocab: int, reference: dict[str, bytes] | None) -> str:
    from bob.backends.nv.rm.backend import NvBackend
    from own_launch import first_difference, inputs, one_launch_plan, run_alone

    arrays = inputs(region.name, vocab)
    start = time.perf_counter()
    try:
        with NvBackend(one_launch_plan(region, vocab)) as backend:
            got = run_alone(backend, arrays)
    except Exception as error:  # noqa: BLE001 - the point is to see it and go on
        return f"FAULT {type(error).__name__}: {str(error)[:160]}"
    took = time.perf_counter() - start
    if reference is None:
        return f"finished ({took:.2f} s)"
    differences = [d for d in (first_difference(t, reference[t], got[t]) for t in reference)
                   if d]
    return ("the reference bytes" if not differences else "differs: " + "; ".join(differences)
            ) + f" ({took:.2f} s)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-V", "--vocab", type=int, default=256)
    parser.add_argument("--regions", default="all")
    vocab = parser.parse_args().vocab
    chosen = parser.parse_args().regions

    from bob.backends.nv.sim import NvSimBackend
    from bob.kernels import own
    from bob.kernels.cuda.regions import compiled_regions
    from bob.kernels.own_regions import OWN_REGIONS, own_regions
    from own_launch import inputs, one_launch_plan, run_alone

    owned, nvrtc = own_regions(SM90), compiled_regions("sm_90")
    names = OWN_REGIONS if chosen == "all" else tuple(chosen.split(","))
    for name in names:
        region = owned[name]
        image = own.image(name, "sm_90")
        reference = run_alone(NvSimBackend(one_launch_plan(region, vocab)),
                              inputs(name, vocab))
        system = 1024 if region.shared_bytes == 0 else region.shared_bytes
        cases: list[tuple[str, Region, bool]] = [
            ("nvrtc", nvrtc[name], True),
            ("nvrtc, own resources", replace(nvrtc[name], registers=region.registers,
                                             shared_bytes=region.shared_bytes), True),
            ("own", region, True),
            ("own, system shared counted", replace(region, shared_bytes=system), True),
            ("own, no trap", variant(region, image.instructions, without_trap), True),
            ("own, slowest", variant(region, image.instructions, slowest), True),
            ("own, no trap, slowest, shared counted",
             variant(region, image.instructions, without_trap, slowest,
                     shared_bytes=system), True),
            ("own, yield off", variant(region, image.instructions, yield_off), True),
            ("own, ACQBULK first", variant(region, image.instructions, prefix=ACQBULK), True),
            ("own, ACQBULK first, no trap, shared counted",
             variant(region, image.instructions, without_trap, prefix=ACQBULK,
                     shared_bytes=system), True),
        ]
        if name == "bob-row-gather":
            cases += [(f"own cut after {k}", variant(region, image.instructions, cut(k)), False)
                      for k in (0, 1, 2, 3, 4, 5, 6, 9, 10, 16)]
            cases += [(f"own cut after {k}, slowest",
                       variant(region, image.instructions, cut(k), slowest), False)
                      for k in (0, 1, 4)]
        for label, case, compare in cases:
            print(f"{name} V={vocab} {label}: {run(case, vocab, reference if compare else None)}",
                  flush=True)


if __name__ == "__main__":
    main()
