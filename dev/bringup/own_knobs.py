"""Which change to an own image makes its results right on the GPU: one knob at a time.

    PYTHONPATH=src:.:tests python3 -m dev.bringup.own_knobs [-V 256] [--region NAME]

Each variant of the region's own image runs alone on nv (tests/own_launch.py's plan and
inputs), twice, against the reference: every scoreboard waited for before every
instruction, the longest yielding stall everywhere, both, a barrier before and after each
reduction tree, more registers in the QMD than the code names. The variant that makes the
results right (and repeatable) names the kind of hazard left.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import numpy as np

from bob.isa.builder import ALL_BOARDS
from bob.isa.control import LONGEST_YIELDING_STALL
from dev.bringup.own_ladder import BRANCHES, body_of, encoded


def waits(body):
    """Every instruction waits on every scoreboard; one that sets a scoreboard stalls 2,
    so that the next one's wait sees it set."""
    def control(each):
        sets = each.control.write is not None or each.control.read is not None
        stall = max(each.control.stall, 2) if sets else each.control.stall
        if each.form.startswith(BRANCHES):
            return replace(each.control, stall=stall)
        return replace(each.control, wait=ALL_BOARDS, stall=stall)
    return [replace(each, control=control(each)) for each in body]


def stalls(body):
    return [each if each.form.startswith(BRANCHES) else
            replace(each, control=replace(each.control, stall=LONGEST_YIELDING_STALL,
                                          yield_bit=True)) for each in body]


def fenced_image(name: str):
    """The image rebuilt with a barrier before and after every reduction tree."""
    from bob.kernels import own
    from bob.kernels.own import seed

    tree = seed.tree

    def fenced(s, *args, **kwargs):
        s.barrier()
        tree(s, *args, **kwargs)
        s.barrier()

    seed.tree = fenced
    try:
        return own.image(name, "sm_90")
    finally:
        seed.tree = tree


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-V", "--vocab", type=int, default=256)
    parser.add_argument("--region", action="append")
    args = parser.parse_args()

    from bob.backends.nv.rm.backend import NvBackend
    from bob.backends.nv.sim import NvSimBackend
    from bob.kernels import own
    from bob.kernels.own_regions import own_regions
    from bob.plan.placement import SM90
    from own_launch import inputs, one_launch_plan, run_alone

    owned = own_regions(SM90)
    vocab = args.vocab
    for name in args.region or ["bob-loss-gradient", "bob-loss-gradient-corpus"]:
        region = owned[name]
        body = body_of(own.image(name, "sm_90").instructions)
        fenced = fenced_image(name)
        variants = {
            "as built": region,
            "every wait": replace(region, code=encoded(waits(body))),
            "every stall 11": replace(region, code=encoded(stalls(body))),
            "every wait and stall 11": replace(region, code=encoded(stalls(waits(body)))),
            "barriers around trees": replace(region, code=fenced.code,
                                             registers=fenced.registers),
            "registers 128": replace(region, registers=128),
            "registers +8": replace(region, registers=region.registers + 8),
        }
        arrays = inputs(name, vocab)
        reference = run_alone(NvSimBackend(one_launch_plan(region, vocab)), arrays)
        for label, variant in variants.items():
            counts = []
            try:
                for _ in range(2):
                    with NvBackend(one_launch_plan(variant, vocab)) as backend:
                        got = run_alone(backend, arrays)
                    rows = np.zeros(vocab, bool)
                    for tensor in ("gradients", "loss"):
                        a = np.frombuffer(reference[tensor], np.uint32).reshape(vocab, -1)
                        b = np.frombuffer(got[tensor], np.uint32).reshape(vocab, -1)
                        rows |= (a != b).any(axis=1)
                    counts.append(int(rows.sum()))
                print(f"{name} V={vocab} {label}: wrong rows {counts}", flush=True)
            except Exception as error:  # noqa: BLE001
                print(f"{name} V={vocab} {label}: FAULT {str(error)[:140]}", flush=True)


if __name__ == "__main__":
    main()
