"""Bob's Python API: the verbs of the command line.

    >>> from bob.host import api
    >>> report = api.train(steps=200, checkpoint="bob.safetensors", backend="cpu")
    >>> api.predict("bob.safetensors", [b"def"], backend="cpu")
    >>> api.generate("bob.safetensors", b"def ", length=40)
    >>> api.generate_samples("bob.safetensors", b"def ", 40, 0.8, seed=1, samples=3)
    >>> api.load_tokenizer("meta.pkl").decode([20, 43])  # nanoGPT's char-level meta
    >>> api.evaluate("bob.safetensors", ["notes.txt"], backend="cpu")
    >>> api.count(api.CorpusSpec(texts=("corpus/",)), "corpus.counts")
    >>> api.run_training(api.TrainRequest(steps=200, resume=True), progress=None)

Each verb lives with its job: `bob.host.data` (corpus specs, counting, input records),
`bob.host.training` (`TrainRequest`, the training driver) and `bob.host.inference`
(predict, generate, evaluate). `train` takes the request's fields as keywords.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bob.host.data import CorpusSpec, CountReport, TrainingData, count, training_data
from bob.host.inference import (
    EvalReport,
    checkpoint_files,
    evaluate,
    evaluate_symbols,
    export,
    generate,
    generate_ids,
    generate_samples,
    generation_start,
    predict,
    predict_ids,
    require_tokenizer,
)
from bob.host.sharded_run import run_training
from bob.host.training import (
    DEFAULT_CHECKPOINT,
    DEFAULT_UPDATES_PER_INVOCATION,
    Announce,
    Progress,
    TrainPlan,
    TrainReport,
    TrainRequest,
)
from bob.records.tokenizer import Tokenizer, load_tokenizer, resolve_vocab

__all__ = [
    "DEFAULT_CHECKPOINT", "DEFAULT_UPDATES_PER_INVOCATION", "Announce", "CorpusSpec",
    "CountReport", "EvalReport", "Progress", "Tokenizer", "TrainPlan", "TrainReport",
    "TrainRequest", "TrainingData", "checkpoint_files",
    "count", "evaluate", "evaluate_symbols", "export", "generate", "generate_ids",
    "generate_samples", "generation_start", "load_tokenizer", "predict", "predict_ids",
    "require_tokenizer", "resolve_vocab", "run_training", "train", "training_data",
]


def train(texts: Sequence[str] | None = None, *, progress: Progress | None = None,
          **fields: Any) -> TrainReport:
    """``run_training(TrainRequest(texts=texts, **fields), progress)``: train for `steps`
    updates, saving the checkpoint as `training.SavePolicy` says (`TrainRequest` names and
    checks the fields)."""
    return run_training(TrainRequest(texts=texts, **fields), progress)
