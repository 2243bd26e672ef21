"""The GPU smoke tier: every GPU backend x schedule x submission policy x mode (corpus with
and without validation on the device), byte for byte against the CPU, in a few minutes
(`pytest -m "gpu and smoke"`).

Each case trains pipelined (`session.train`: the resident arena, the next invocation
started before the last is read back) from a table that is not zero, then predicts, and
compares every tensor of the arena with the CPU backend's after the same invocations.
The large-V case and the backends' own primitives are marked `smoke` where they live
(tests/test_vocab64_gpu.py, test_host_pipe_cuda.py, test_nv_stream_gpu.py).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from bob.backends import choose_backend
from bob.config import Hyper
from bob.errors import BackendUnavailable
from bob.host.check import compare_backends, random_record
from bob.host.session import Session, train
from bob.records.checkpoint import Checkpoint
from conftest import bob_config, validation_record

pytestmark = [pytest.mark.gpu, pytest.mark.smoke]

STEPS, PER_INVOCATION = 7, 3  # invocations of 3, 3 and 1 updates


def opened(name: str):
    try:
        return choose_backend(name)
    except BackendUnavailable as why:
        pytest.skip(str(why))


@pytest.mark.parametrize(("mode", "validation"), [("hard", 0), ("corpus", 0), ("corpus", 300)],
                         ids=["hard", "corpus", "corpus-validation"])
@pytest.mark.parametrize("submission", ["per-launch", "chained"])
@pytest.mark.parametrize("schedule", ["seed", "fused"])
@pytest.mark.parametrize("backend", ["cuda", "nv"])
def test_a_backend_trains_and_predicts_the_cpu_s_bytes(backend: str, schedule: str,
                                                      submission: str, mode: str,
                                                      validation: int) -> None:
    config = bob_config(vocab=256, prompts=2, updates=PER_INVOCATION, mode=mode,
                        schedule=schedule, submission=submission,
                        **({"validation_pairs": validation} if validation else {}))
    record = random_record(config, seed=11)
    held_out = validation_record(config, seed=12) if validation else None
    rng = np.random.default_rng(5)
    start = replace(Checkpoint.zeros(config.vocab, Hyper(), mode),
                    parameters=rng.standard_normal((256, 256), dtype=np.float32))
    choices = (choose_backend("cpu"), opened(backend))
    with Session(choices[0]) as cpu, Session(choices[1]) as gpu:
        done = [train(session, config, start, record, STEPS, validation=held_out)[-1]
                for session in (cpu, gpu)]
        difference = compare_backends(cpu.last_backend, gpu.last_backend, 2)
        assert difference is None, f"{backend} {config}: {difference}"
        for name in ("parameters", "first_moment", "second_moment"):
            assert getattr(done[0].checkpoint, name).tobytes() == \
                getattr(done[1].checkpoint, name).tobytes(), name
        assert (done[0].loss, done[0].initial_loss) == (done[1].loss, done[1].initial_loss)
        assert done[0].validation == done[1].validation
        for session in (cpu, gpu):
            session.invoke(replace(config, updates=0), done[0].checkpoint, record, "predict",
                           validation=held_out)
        difference = compare_backends(cpu.last_backend, gpu.last_backend, -1)
        assert difference is None, f"{backend} {config} predict: {difference}"
