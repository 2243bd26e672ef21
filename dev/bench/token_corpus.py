"""A GPT-2-sized token corpus for the benches: nanoGPT's train.bin/val.bin, made here.

    python dev/bench/token_corpus.py OUT_DIR [--vocab 50257]

Trains a byte-level BPE tokenizer (the `tokenizers` package, Bob's `[tokens]` extra) on a
public text that ships with Python: the built-in corpus (CPython's pydoc topics), then the
standard library's top-level modules in name order, `--text-bytes` in all. It encodes that
text with the tokenizer and writes, as nanoGPT's
prepare scripts do, `train.bin` (the first 90% of the tokens) and `val.bin` (the rest) as
uint16, and `tokenizer.json`. The tokenizer stops merging when the text has no pair left to
merge, so its ids stay well below V: as with a small text under GPT-2's tokenizer, most of
the V x V table is never seen. Deterministic for a given Python (the text ships with it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np


def public_text(size: int) -> str:
    """The built-in corpus, then the standard library's top-level modules, `size` bytes."""
    import sysconfig

    from bob.records.corpus import builtin_corpus

    parts, total = [builtin_corpus()], len(builtin_corpus())
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        if total >= size:
            break
        data = path.read_bytes()
        parts.append(data)
        total += len(data)
    return b"".join(parts)[:size].decode("utf-8", errors="ignore")


TOKEN_FILES = ("train.bin", "val.bin", "tokenizer.json")  # what write_token_corpus writes


def write_token_corpus(out: Path, vocab: int = 50257, val_fraction: float = 0.1,
                       text_bytes: int = 1 << 20) -> str:
    """Train the tokenizer, encode the text, write TOKEN_FILES into `out`; the summary line.
    ImportError without the tokenizers package, ValueError for a V uint16 cannot hold."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if vocab > 65536:
        raise ValueError("uint16 token files hold ids below 65536")
    text = public_text(text_bytes)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(text.splitlines(keepends=True), trainer)
    ids = np.array(tokenizer.encode(text).ids, np.uint16)
    split = int(len(ids) * (1.0 - val_fraction))
    out.mkdir(parents=True, exist_ok=True)
    ids[:split].tofile(out / "train.bin")
    ids[split:].tofile(out / "val.bin")
    tokenizer.save(str(out / "tokenizer.json"))
    return (f"{out}: {split} train and {len(ids) - split} val tokens, ids below "
            f"{int(ids.max()) + 1} (tokenizer of {tokenizer.get_vocab_size()}), V = {vocab}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--vocab", type=int, default=50257, help="the tokenizer's largest V")
    parser.add_argument("--val-fraction", type=float, default=0.1)
    parser.add_argument("--text-bytes", type=int, default=1 << 20,
                        help="bytes of text to tokenize (the default gives about 300k tokens)")
    args = parser.parse_args(argv)
    try:
        print(write_token_corpus(args.out, args.vocab, args.val_fraction, args.text_bytes))
    except ImportError:
        print("token_corpus.py needs the tokenizers package: pip install 'bob-bigram[tokens]'",
              file=sys.stderr)
        return 2
    except ValueError as error:
        print(error, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
