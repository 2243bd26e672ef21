"""Which edge inputs an own loss-gradient image treats unlike the reference, on the GPU.

    PYTHONPATH=src:.:tests python3 -m dev.bringup.own_edges [-V 256]

tests/own_launch.py plants every edge value at once; here each class of edge (NaN,
infinities, the largest finite values, subnormals and tiny normals, signed zeros, a row
of ties) is planted alone in otherwise ordinary rows, in the parameters and (corpus) the
weights, and the rows where the own image's bytes leave the reference's are described
by the planted values they hold.
"""

from __future__ import annotations

import argparse

import numpy as np

EDGE_CLASSES = {
    "none": np.array([], np.float32),
    "nan": np.array([np.nan], np.float32),
    "infinities": np.array([np.inf, -np.inf], np.float32),
    "largest": np.array([3.0e38, -3.0e38], np.float32),
    "subnormal": np.array([0x00000001, 0x00000003, 0x007FFFFF, 0x80000002, 0x80400000],
                          np.uint32).view(np.float32),
    "tiny normal": np.array([1.0e-38, -1.0e-38], np.float32),
    "zeros": np.array([0.0, -0.0], np.float32),
}


def planted(vocab: int, name: str, edges: np.ndarray, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    values = rng.standard_normal(vocab * vocab, dtype=np.float32) * 4
    if name == "weights":
        values = np.abs(values) / vocab
    if len(edges):
        where = rng.choice(vocab * vocab, 4 * vocab // 16, replace=False)
        values[where] = np.resize(edges, len(where))
    return values.astype(np.float32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-V", "--vocab", type=int, default=256)
    vocab = parser.parse_args().vocab

    from bob.backends.nv.rm.backend import NvBackend
    from bob.backends.nv.sim import NvSimBackend
    from bob.kernels import signatures as sig
    from bob.kernels.own_regions import own_regions
    from bob.plan.placement import SM90
    from own_launch import inputs, one_launch_plan, run_alone

    owned = own_regions(SM90)
    for region in (sig.LOSS_HARD, sig.LOSS_CORPUS):
        base = inputs(region, vocab)
        tensors = ["parameters"] + (["weights"] if region == sig.LOSS_CORPUS else [])
        for tensor in tensors:
            for label, edges in EDGE_CLASSES.items():
                arrays = dict(base)
                for each in tensors:  # ordinary values everywhere, edges in one tensor
                    arrays[each] = planted(vocab, each, edges if each == tensor else
                                           EDGE_CLASSES["none"], seed=len(label))
                plan = one_launch_plan(owned[region], vocab)
                reference = run_alone(NvSimBackend(plan), arrays)
                try:
                    with NvBackend(plan) as backend:
                        got = run_alone(backend, arrays)
                except Exception as error:  # noqa: BLE001
                    print(f"{region} {tensor} {label}: FAULT {str(error)[:120]}", flush=True)
                    continue
                ref_g = np.frombuffer(reference["gradients"], np.uint32).reshape(vocab, -1)
                got_g = np.frombuffer(got["gradients"], np.uint32).reshape(vocab, -1)
                ref_l = np.frombuffer(reference["loss"], np.uint32)
                got_l = np.frombuffer(got["loss"], np.uint32)
                rows = sorted(set(np.nonzero((ref_g != got_g).any(axis=1))[0])
                              | set(np.nonzero(ref_l != got_l)[0]))
                source = arrays[tensor].reshape(vocab, vocab)
                special = ~np.isfinite(source) | (np.abs(source) < 1.2e-38) | \
                    (np.abs(source) > 1e38)
                edge_rows = set(np.nonzero(special.any(axis=1))[0])
                line = (f"{region} {tensor} {label}: {len(rows)} of {vocab} rows differ"
                        f" ({len(set(rows) & edge_rows)} of them hold a planted edge;"
                        f" {len(edge_rows)} rows hold one)")
                if rows:
                    row = rows[0]
                    columns = np.nonzero(ref_g[row] != got_g[row])[0]
                    line += (f"; row {row}: loss {ref_l[row]:#010x} vs {got_l[row]:#010x},"
                             f" {len(columns)} gradients differ, first column"
                             f" {columns[0] if len(columns) else '-'}")
                    if len(columns):
                        c = columns[0]
                        line += (f" (input {source[row, c]!r}: {ref_g[row, c]:#010x} vs"
                                 f" {got_g[row, c]:#010x})")
                    held = sorted(set(source[row][special[row]].tolist()))[:6]
                    line += f"; planted in the row: {held}"
                print(line, flush=True)


if __name__ == "__main__":
    main()
