"""`bob bench`'s nv rows, without a GPU: which configurations are asked for, with which
policy, at which V, and that a failing or missing nv becomes a row, never the end.

    .venv/bin/python -m pytest -q tests/test_bench_nv.py

measure_bob is replaced by a recorder (no timing is real here).
"""

from __future__ import annotations

import pytest

from bob.backends import BackendChoice
from bob.config import Hyper
from bob.errors import BackendUnavailable, BadInput
from bob.plan.placement import SM90
from dev.bench import suite
from dev.bench.tables import Row

NV = BackendChoice("nv", SM90, reason="a fake nv")
CUDA = BackendChoice("cuda", SM90, reason="a fake cuda")


@pytest.fixture
def asked(monkeypatch) -> list[tuple[str, str, str, str, int]]:
    """Every measure_bob call as (backend, label, schedule, policy, V); nv and cuda
    'usable'; the peers not run."""
    calls: list[tuple[str, str, str, str, int]] = []

    def measuring(choice, config, hyper, repeats, label="", record=None):
        calls.append((choice.name, label, config.schedule, config.submission, config.vocab))
        return [Row(f"bob {choice.name}{label} invocation", "bob", config.updates, 1e-3,
                    (1e-3,), 1.0)]

    monkeypatch.setattr(suite, "measure_bob", measuring)
    monkeypatch.setattr(suite, "choose_backend",
                        lambda name, **kw: NV if name == "nv" else CUDA)
    monkeypatch.setattr(suite, "measure_peer",
                        lambda make, name, updates, repeats: Row(name, "peer", updates))
    return calls


def _cuda_table(vocab: int, submission: str = "auto"):
    return suite.bench_device("cuda", vocab, 100, 1, Hyper(), CUDA, "a fake GPU",
                              lambda text: None, None, submission)


def test_nv_rows_run_at_8192_in_both_schedules_chained(asked):
    table = _cuda_table(8192)
    nv = [call for call in asked if call[0] == "nv"]
    assert nv == [("nv", "", "seed", "chained", 8192),
                  ("nv", " fused", "fused", "chained", 8192)]  # no per-launch row this large
    cuda = [call for call in asked if call[0] == "cuda"]  # the same configurations as cuda's
    assert [(label, schedule) for _, label, schedule, _, _ in cuda] == \
        [(label, schedule) for _, label, schedule, _, _ in nv]
    assert {policy for *_, policy, _ in cuda} == {"per-launch"}
    names = [row.contender for row in table.rows]
    assert {"bob nv invocation", "bob nv fused invocation"} <= set(names)


@pytest.mark.parametrize("vocab", [256, suite.PER_LAUNCH_ROW_MAX_VOCAB])
def test_a_per_launch_nv_seed_row_is_beside_the_chained_ones_at_small_v(vocab, asked):
    _cuda_table(vocab)
    assert [call[1:4] for call in asked if call[0] == "nv"] == [
        ("", "seed", "chained"), (" fused", "fused", "chained"),
        (" per-launch", "seed", "per-launch")]


@pytest.mark.parametrize("vocab", [256, 1024, 8192, 65536])
def test_nv_rows_are_asked_for_at_every_v_the_cuda_table_runs(vocab, asked):
    _cuda_table(vocab)
    assert {call[4] for call in asked if call[0] == "nv"} == {vocab}


def test_a_named_policy_runs_every_row_and_per_launch_adds_no_comparison_row(asked):
    _cuda_table(256, "per-launch")
    assert [call[1:4] for call in asked if call[0] == "nv"] == [
        ("", "seed", "per-launch"), (" fused", "fused", "per-launch")]
    asked.clear()
    _cuda_table(256, "chained")
    assert [call[:4] for call in asked if call[0] == "cuda"] == [  # cuda runs it too
        ("cuda", "", "seed", "chained"), ("cuda", " fused", "fused", "chained")]
    assert [call[1:4] for call in asked if call[0] == "nv"] == [
        ("", "seed", "chained"), (" fused", "fused", "chained"),
        (" per-launch", "seed", "per-launch")]


def test_a_failing_nv_configuration_is_a_failed_row_and_the_rest_still_run(asked, monkeypatch):
    recording = suite.measure_bob

    def failing_fused(choice, config, hyper, repeats, label="", record=None):
        if choice.name == "nv" and config.schedule == "fused":
            raise RuntimeError("the channel died")
        return recording(choice, config, hyper, repeats, label, record)

    monkeypatch.setattr(suite, "measure_bob", failing_fused)
    table = _cuda_table(8192)
    (failed,) = [row for row in table.rows if row.contender == "bob nv fused invocation"]
    assert failed.error == "failed: RuntimeError: the channel died" and failed.kind == "bob"
    assert [call[1] for call in asked if call[0] == "nv"] == [""]
    assert any(row.contender == "pytorch eager" for row in table.rows)  # the peers ran on


def test_an_absent_nv_is_one_skipped_row(asked, monkeypatch):
    def no_nv(name, **kw):
        if name == "nv":
            raise BackendUnavailable("the nv backend cannot run here: no /dev/nvidiactl")
        return CUDA

    monkeypatch.setattr(suite, "choose_backend", no_nv)
    table = _cuda_table(8192)
    (row,) = [row for row in table.rows if row.contender.startswith("bob nv")]
    assert row.error == ("skipped: BackendUnavailable: the nv backend cannot run here: "
                         "no /dev/nvidiactl")
    assert not table.bob_failed  # a missing nv is not Bob failing


def test_cpu_tables_have_no_nv_rows(asked):
    suite.bench_device("cpu", 8, 2, 1, Hyper(), BackendChoice("cpu", SM90), "a CPU",
                       lambda text: None)
    assert [call[:4] for call in asked] == [("cpu", "", "seed", "per-launch"),
                                            ("cpu", " fused", "fused", "per-launch")]


@pytest.mark.parametrize("fused_covered", [False, True])
def test_own_kernels_add_the_rows_own_code_covers(monkeypatch, asked, fused_covered):
    from bob.kernels import own as own_kernels
    from bob.kernels import signatures as sig

    if fused_covered:
        monkeypatch.setitem(own_kernels.BUILDERS, sig.FUSED_HARD, own_kernels.BUILDERS[sig.ADAMW])
    else:  # own code serves no V = 256 fused plan
        monkeypatch.setitem(own_kernels.VOCAB_LIMITS, sig.FUSED_HARD, 128)
    kernels_asked = []
    own = BackendChoice("nv", SM90, reason="a fake nv with Bob's own kernels", kernels="own")

    def choose(name, **keywords):
        kernels_asked.append((name, keywords.get("kernels", "nvrtc")))
        return own if keywords.get("kernels") == "own" else NV if name == "nv" else CUDA

    monkeypatch.setattr(suite, "choose_backend", choose)
    table = suite.bench_device("cuda", 256, 100, 1, Hyper(), CUDA, "a fake GPU",
                               lambda text: None, None, "auto", kernels="own")
    assert ("nv", "own") in kernels_asked
    assert [call[1:4] for call in asked if call[0] == "nv"] == [
        ("", "seed", "chained"), (" fused", "fused", "chained"),
        (" per-launch", "seed", "per-launch"),
        (" own", "seed", "chained"),
        *([(" own fused", "fused", "chained")] if fused_covered else []),
        (" own per-launch", "seed", "per-launch")]
    assert "bob nv own invocation" in [row.contender for row in table.rows]


def test_own_kernels_are_benched_beside_cuda_only():
    with pytest.raises(BadInput, match="give --backend cuda"):
        suite.run_bench(("cpu",), kernels="own")
    with pytest.raises(BadInput, match="kernels must be one of nvrtc, own, not 'ptx'"):
        suite.run_bench(("cuda",), kernels="ptx")
