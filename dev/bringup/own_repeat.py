"""Whether an own image's results repeat run to run on the GPU, and at which V they leave
the reference's: a race or latency hazard shows as results that change between runs.

    PYTHONPATH=src:.:tests python3 -m dev.bringup.own_repeat [--regions a,b] [-V 32 -V 256]
"""

from __future__ import annotations

import argparse

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-V", "--vocab", type=int, action="append")
    parser.add_argument("--regions", default="bob-loss-gradient,bob-loss-gradient-corpus")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--grid", type=int, action="append",
                        help="also launch only this many blocks (rows 0..grid-1 compared)")
    args = parser.parse_args()

    from bob.backends.nv.rm.backend import NvBackend
    from bob.backends.nv.sim import NvSimBackend
    from bob.kernels.own_regions import own_regions
    from bob.plan.placement import SM90
    from own_launch import inputs, one_launch_plan, run_alone

    owned = own_regions(SM90)
    for name in args.regions.split(","):
        for vocab, grid in [(v, None) for v in args.vocab or [32, 256]] + \
                [(v, g) for v in args.vocab or [256] for g in args.grid or []]:
            arrays = inputs(name, vocab)
            full = one_launch_plan(owned[name], vocab)
            reference = run_alone(NvSimBackend(full), arrays)
            plan = one_launch_plan(owned[name], vocab, grid)
            if grid is not None:  # the first rows' inputs
                sizes = {each.name: each.bytes // 4 for each in plan.tensors}
                arrays = {k: v[:sizes[k]] for k, v in arrays.items()}
            runs = []
            for _ in range(args.runs):
                with NvBackend(plan) as backend:
                    runs.append(run_alone(backend, arrays))
            for tensor in ("gradients", "loss"):
                rows = vocab if grid is None else grid
                ref = np.frombuffer(reference[tensor], np.uint32).reshape(vocab, -1)[:rows]
                ref = ref.reshape(-1)
                got = [np.frombuffer(run[tensor], np.uint32)[:ref.size] for run in runs]
                off = [int((g != ref).sum()) for g in got]
                between = [int((got[0] != g).sum()) for g in got[1:]]
                print(f"{name} V={vocab} grid={grid or vocab} {tensor}: differs from the "
                      f"reference in {off} of {ref.size}; run 1 against the others: "
                      f"{between}", flush=True)


if __name__ == "__main__":
    main()
