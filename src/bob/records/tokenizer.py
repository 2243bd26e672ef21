"""Tokenizers read from files: what turns a token model's ids into text and back.

    >>> from bob.records.tokenizer import load_tokenizer
    >>> chars = load_tokenizer("data/shakespeare_char/meta.pkl")  # nanoGPT's char-level meta
    >>> chars.vocab, chars.encode("ROMEO:"), chars.decode([30, 27])
    >>> load_tokenizer("tokenizer.json")  # a Hugging Face `tokenizers` file ([tokens] extra)
    >>> load_tokenizer("gpt2")  # a tiktoken encoding, where tiktoken and its data are here

Three kinds, told apart by the file's first byte (a pickle starts with its PROTO opcode,
a JSON file with "{"); a name that is no file is a tiktoken encoding. nanoGPT's
`meta.pkl` (`prepare.py` of its character-level data sets: `vocab_size`, `stoi`, `itos`) is
read by an unpickler that builds no object but plain dicts, ints and strings: it resolves
no class or function, so a pickle that names one is refused instead of run.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import pickle
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from bob.config import MAX_VOCAB, MIN_VOCAB
from bob.errors import BadInput, reason_of
from bob.files import StrPath, read_bytes

# A character-level meta.pkl of the largest V is a few MB; a file far larger is not one.
MAX_META_BYTES = 64 << 20
PICKLE_PROTO = 0x80  # protocol 2 and later open with it


@dataclass(frozen=True)
class Tokenizer:
    """A vocabulary of V token ids with its encoder and decoder."""

    name: str  # the file, or the tiktoken encoding's name
    kind: str  # "meta.pkl", "tokenizers" or "tiktoken"
    vocab: int  # V: every id it makes or reads is below it
    encoder: Callable[[str], list[int]]
    decoder: Callable[[Sequence[int]], str]

    def encode(self, text: str) -> list[int]:
        return [int(i) for i in self.encoder(text)]

    def decode(self, ids: Sequence[int]) -> str:
        return self.decoder([int(i) for i in ids])

    def require_vocab(self, vocab: int, what: str) -> None:
        """BadInput unless `what` (a checkpoint, --vocab) has this tokenizer's V."""
        if vocab != self.vocab:
            raise BadInput(f"{what}: V={vocab}, but the tokenizer {self.name} has "
                           f"V={self.vocab}")


def load_tokenizer(source: StrPath) -> Tokenizer:
    """The tokenizer in a file (a `tokenizers` JSON or nanoGPT's meta.pkl), or a tiktoken
    encoding by name; BadInput naming it when it is none of them."""
    name = os.fspath(source)
    if not os.path.exists(name) and _bare_name(name):
        return _tiktoken(name)
    data = read_bytes(name, "tokenizer file")
    head = data.lstrip()[:1]
    if data[:1] == bytes([PICKLE_PROTO]):
        return _meta_pkl(name, data)
    if head == b"{":
        return _tokenizers_json(name, data)
    raise BadInput(f"{name}: not a tokenizer (expected a Hugging Face tokenizers JSON file "
                   "or nanoGPT's meta.pkl)")


def resolve_vocab(vocab: int | None, tokenizer: Tokenizer | None) -> int | None:
    """V from --vocab, or from the tokenizer where --vocab is not given; BadInput where
    both are given and differ."""
    if tokenizer is None:
        return vocab
    if vocab is not None:
        tokenizer.require_vocab(vocab, "--vocab")
    return tokenizer.vocab


def _bare_name(name: str) -> bool:
    """A name such as "gpt2" or "cl100k_base": no directory, no suffix."""
    return bool(name) and os.sep not in name and "." not in name


# -- nanoGPT's meta.pkl ------------------------------------------------------------
class _PlainUnpickler(pickle.Unpickler):
    """Builds only what pickle makes without a global: it resolves no class or function,
    and no persistent id (an object the pickler kept outside the file)."""

    def find_class(self, module: str, name: str) -> object:
        raise pickle.UnpicklingError(f"it names {module}.{name}, and a meta.pkl holds only "
                                     "dicts, ints and strings")

    def persistent_load(self, pid: object) -> object:
        # pickle's own refusal is two lines; a meta.pkl keeps everything in the file.
        raise pickle.UnpicklingError("it refers to an object outside the file (a persistent "
                                     "id), and a meta.pkl holds only dicts, ints and strings")


def _meta_pkl(name: str, data: bytes) -> Tokenizer:
    if len(data) > MAX_META_BYTES:
        raise BadInput(f"{name}: {len(data):,} bytes is too large for a character-level "
                       "meta.pkl")
    try:
        meta = _PlainUnpickler(io.BytesIO(data)).load()
    except pickle.UnpicklingError as error:
        raise BadInput(f"{name}: refused as a meta.pkl: {reason_of(error)}") from None
    except (EOFError, ValueError, TypeError, IndexError, KeyError, AttributeError,
            RecursionError, MemoryError) as error:
        raise BadInput(f"{name}: not a readable pickle ({type(error).__name__})") from None
    problem = _plain_problem(meta)
    if problem:
        raise BadInput(f"{name}: refused as a meta.pkl: {problem}")
    if not isinstance(meta, dict) or not {"vocab_size", "stoi", "itos"} <= set(meta):
        raise BadInput(f"{name}: not nanoGPT's meta.pkl (a dict of vocab_size, stoi and itos)")
    vocab, stoi, itos = meta["vocab_size"], meta["stoi"], meta["itos"]
    if not isinstance(vocab, int) or not MIN_VOCAB <= vocab <= MAX_VOCAB:
        raise BadInput(f"{name}: vocab_size {vocab!r} is outside [{MIN_VOCAB}, {MAX_VOCAB}]")
    # Every key and value's type before any comparison: a pickle nobody here wrote may mix
    # int and str keys, which neither sort nor compare.
    if not isinstance(itos, dict) or not all(isinstance(i, int) for i in itos) \
            or set(itos) != set(range(vocab)) \
            or not all(isinstance(s, str) for s in itos.values()):
        raise BadInput(f"{name}: itos is not a string for each id 0..{vocab - 1}")
    if not isinstance(stoi, dict) or len(stoi) != vocab \
            or not all(isinstance(s, str) and isinstance(i, int) for s, i in stoi.items()) \
            or any(itos.get(i) != s for s, i in stoi.items()):
        raise BadInput(f"{name}: stoi is not the inverse of itos")
    if any(len(s) != 1 for s in stoi):
        longer = next(s for s in stoi if len(s) != 1)
        raise BadInput(f"{name}: stoi key {longer!r} is not one character (a character-level "
                       "meta.pkl maps characters)")
    symbols = [itos[i] for i in range(vocab)]

    def encode(text: str) -> list[int]:
        for position, char in enumerate(text):
            if char not in stoi:
                raise BadInput(f"{char!r} (character {position} of the text) is not in the "
                               f"vocabulary of {name}")
        return [stoi[char] for char in text]

    def decode(ids: Sequence[int]) -> str:
        return "".join(symbols[i] for i in ids)

    return Tokenizer(name, "meta.pkl", vocab, encode, decode)


def _plain_problem(value: object, depth: int = 0) -> str | None:
    """What in a loaded pickle is not a dict, an int or a string (nested at most 3 deep)."""
    if depth > 3:
        return "it nests deeper than a meta.pkl does"
    if isinstance(value, bool) or not isinstance(value, dict | int | str):
        return f"it holds a {type(value).__name__}, and a meta.pkl holds only dicts, ints " \
               "and strings"
    if isinstance(value, dict):
        for key, item in value.items():
            problem = _plain_problem(key, depth + 1) or _plain_problem(item, depth + 1)
            if problem:
                return problem
    return None


# -- Hugging Face tokenizers -----------------------------------------------------------
def _tokenizers_json(name: str, data: bytes) -> Tokenizer:
    if importlib.util.find_spec("tokenizers") is None:
        raise BadInput(f"{name}: a tokenizers JSON file needs the tokenizers package, not "
                       "installed here: pip install 'bob-bigram[tokens]'")
    from tokenizers import Tokenizer as HuggingFaceTokenizer

    try:
        json.loads(data)
        loaded = HuggingFaceTokenizer.from_str(data.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as error:
        raise BadInput(f"{name}: not JSON ({error})") from None
    except Exception as error:  # the Rust side raises plain Exceptions
        reason = reason_of(error)
        raise BadInput(f"{name}: not a tokenizers file ({reason})") from None
    vocab = loaded.get_vocab_size(with_added_tokens=True)
    if not MIN_VOCAB <= vocab <= MAX_VOCAB:
        raise BadInput(f"{name}: its vocabulary of {vocab} is outside [{MIN_VOCAB}, "
                       f"{MAX_VOCAB}]")

    def encode(text: str) -> list[int]:
        return loaded.encode(text, add_special_tokens=False).ids

    def decode(ids: Sequence[int]) -> str:
        return loaded.decode(list(ids), skip_special_tokens=False)

    return Tokenizer(name, "tokenizers", vocab, encode, decode)


# -- tiktoken, where it and its data are here -----------------------------------------
def _tiktoken(name: str) -> Tokenizer:
    if importlib.util.find_spec("tiktoken") is None:
        raise BadInput(f"{name}: no such file; as a tiktoken encoding name it needs the "
                       "tiktoken package, not installed here")
    import tiktoken

    try:
        encoding = tiktoken.get_encoding(name)
    except Exception as error:  # an unknown name, or data that cannot be had here
        reason = reason_of(error)
        raise BadInput(f"{name}: no such file, and tiktoken cannot load it as an encoding "
                       f"({reason}); its data must be in tiktoken's cache") from None
    vocab = int(encoding.n_vocab)
    if not MIN_VOCAB <= vocab <= MAX_VOCAB:
        raise BadInput(f"{name}: its vocabulary of {vocab} is outside [{MIN_VOCAB}, "
                       f"{MAX_VOCAB}]")

    def encode(text: str) -> list[int]:
        return encoding.encode(text, allowed_special="all")

    def decode(ids: Sequence[int]) -> str:
        return encoding.decode(list(ids))

    return Tokenizer(name, "tiktoken", vocab, encode, decode)
