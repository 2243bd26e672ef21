"""PyTorch's eager loop on a token corpus, end to end, as one process:

    PYTHONPATH=src python3 -m dev.bench.torch_corpus --tokens train.bin --vocab 50257 --steps 1000
    PYTHONPATH=src python3 -m dev.bench.torch_corpus --counts c.counts --steps 1000

What a PyTorch user writes to train Bob's corpus objective: read the tokens, count the
adjacent pairs on the device (`torch.unique` of prev * V + next), build the dense weights
T = C / N there (or read Bob's counts file and scatter its sparse pairs into T), then N
updates of `F.log_softmax`-based loss, `backward()` and `torch.optim.AdamW.step()` (the
default implementation) from a zero table. No validation, no checkpoint: the bench sets
this beside `bob train`, which does both.

Prints one JSON line: the seconds to prepare T and to train (each ended by a device
synchronize), the seconds per update, the loss after the last update, K and N; or
{"skipped": reason} where PyTorch, the device or room for the tables is missing.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from bob.config import Hyper
from dev.bench.peers import (
    Unavailable,
    out_of_memory,
    require_room,
    torch_corpus_loss,
    torch_dense_weights,
    torch_free_bytes,
    torch_modules,
)


def read_tokens(path: str) -> np.ndarray:
    """A raw uint16 token file (nanoGPT's train.bin), or a .npy array."""
    return np.load(path, mmap_mode="r") if path.endswith(".npy") else np.fromfile(path, "<u2")


def weights_from_tokens(torch, path: str, vocab: int, device: str):
    """T[V][V] = C / N of the file's adjacent pairs, counted on `device`; and K."""
    ids = torch.as_tensor(read_tokens(path).astype(np.int32), device=device).long()
    keys = ids[:-1] * vocab + ids[1:]
    pairs, counts = torch.unique(keys, return_counts=True)
    del ids, keys
    table = torch.zeros(vocab * vocab, dtype=torch.float32, device=device)
    table[pairs] = (counts.double() / counts.sum()).float()
    return table.view(vocab, vocab), int(pairs.numel())


def weights_from_counts(torch, counted, device: str):
    """T[V][V] from Bob's counts file (a `CountsFile`): its sparse pairs scattered on
    `device`; and K."""
    keys, counts = counted.counts.pairs()
    values = (counts.astype(np.float64) / counted.transitions).astype(np.float32)
    return torch_dense_weights(torch, counted.vocab, keys, values, device), len(keys)


def train(torch, functional, weights, steps: int, hyper: Hyper):
    """The eager loop from a zero table; the trained table."""
    vocab = weights.shape[0]
    w = torch.zeros((vocab, vocab), dtype=torch.float32, device=weights.device,
                    requires_grad=True)
    optimizer = torch.optim.AdamW([w], lr=hyper.lr, betas=(hyper.beta1, hyper.beta2),
                                  eps=hyper.eps, weight_decay=hyper.weight_decay)
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        loss = torch_corpus_loss(functional, w, weights)
        loss.backward()
        optimizer.step()
    return w


def run(args: argparse.Namespace) -> dict:
    torch, functional = torch_modules()
    device = args.device
    if device == "cuda" and not torch.cuda.is_available():
        raise Unavailable("PyTorch sees no CUDA device")
    hyper = Hyper(lr=args.lr, beta1=args.beta1, beta2=args.beta2, eps=args.eps,
                  weight_decay=args.weight_decay)

    def synchronize() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    begun = time.perf_counter()
    counted = None
    if args.counts is not None:
        from bob.records.countsfile import CountsFile

        counted = CountsFile.load(args.counts)  # sparse: K pairs on the host
    vocab = args.vocab if counted is None else counted.vocab
    if device == "cuda":  # before any table is made
        require_room("pytorch eager", "torch eager", "corpus", vocab, torch_free_bytes(torch))
    if counted is not None:
        weights, pairs = weights_from_counts(torch, counted, device)
    else:
        weights, pairs = weights_from_tokens(torch, args.tokens, vocab, device)
    synchronize()
    prepared = time.perf_counter()
    w = train(torch, functional, weights, args.steps, hyper)
    synchronize()
    trained = time.perf_counter()
    with torch.no_grad():
        loss = float(torch_corpus_loss(functional, w, weights))
    return {"vocab": vocab, "pairs": pairs, "steps": args.steps, "device": device,
            "prepare_seconds": prepared - begun, "train_seconds": trained - prepared,
            "seconds_per_update": (trained - prepared) / args.steps if args.steps else None,
            "loss": loss, "torch": torch.__version__}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    data = parser.add_mutually_exclusive_group(required=True)
    data.add_argument("--tokens", help="a raw uint16 token file (or .npy); needs --vocab")
    data.add_argument("--counts", help="Bob's counts file (`bob count`)")
    parser.add_argument("--vocab", type=int, help="V (read from --counts)")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    defaults = Hyper()
    for name in ("lr", "beta1", "beta2", "eps", "weight_decay"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=float,
                            default=getattr(defaults, name))
    args = parser.parse_args(argv)
    if args.tokens is not None and args.vocab is None:
        parser.error("--tokens needs --vocab")
    try:
        report = run(args)
    except Unavailable as reason:
        report = {"skipped": str(reason)}
    except Exception as error:
        if not out_of_memory(error):
            raise
        report = {"skipped": f"out of device memory ({str(error).splitlines()[0]})"}
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
