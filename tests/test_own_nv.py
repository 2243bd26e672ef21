"""Bob's own machine code beyond the seed schedule, and the nv backend without NVIDIA's
userspace: `--kernels own` on every plan own code covers (bob.kernels.own.covers), refused
in one line before any work naming the regions it does not cover; nv where cuda-bindings
and NVRTC are not installed runs Bob's own regions alone; auto tries cuda, then nv, then
cpu; `bob doctor` says whose kernels nv runs.

A machine without the CUDA wheels is simulated by an import blocker (a sys.meta_path finder
refusing `cuda` and `nvidia`) in a subprocess, where no module can have been imported
before it; the GPU by a fake `nv_available`. Everything runs on the CPU: nv-sim takes
`--kernels own` as nv does, and runs the reference kernels from the command stream.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from bob.backends import registry
from bob.backends.registry import BackendChoice
from bob.cli.main import main
from bob.errors import BackendUnavailable, BadInput
from bob.host import own_code
from bob.kernels import own
from bob.kernels import own_regions as regions_module
from bob.kernels import signatures as sig
from bob.kernels.own_regions import OWN_REGIONS, coverage_refusal, uncovered
from bob.plan.placement import SM90
from bob.program.bob import BobConfig
from bob.records.binary import InputRecord
from conftest import contents

ROOT = Path(__file__).resolve().parent.parent
FAKE_GPU = "HOPPER_COMPUTE_A through the kernel driver (a fake)"
OWN_LIST = ", ".join(OWN_REGIONS)
CUDA_EXTRA = "pip install 'bob-bigram[cuda]'"

# Run in a fresh interpreter: the CUDA wheels refused before anything is imported, a fake
# Hopper GPU behind the kernel driver. It prints what the registry and doctor say as JSON.
NO_CUDA_WHEELS = r'''
import importlib.abc, json, sys

class NoCudaWheels(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("cuda", "nvidia"):
            raise ImportError(f"No module named {name!r}")
        return None

sys.meta_path.insert(0, NoCudaWheels())
import bob.backends.nv.rm.backend as nv_backend  # the whole nv chain, no CUDA wheel
nv_backend.nv_available = lambda: (True, "HOPPER_COMPUTE_A through the kernel driver (a fake)")
from bob.backends import registry
from bob.host import doctor

doctor._kernel_module = lambda: "the kernel module"
nv = registry.choose_backend("nv")
auto = registry.choose_backend("auto")
print(json.dumps({
    "loaded": sorted(name for name in sys.modules if name.split(".")[0] in ("cuda", "nvidia")),
    "nv": [nv.kernels, nv.own_only, sorted(nv.regions), nv.reason],
    "auto": [auto.name, auto.reason],
    "doctor": {row["backend"]: row["details"] for row in doctor.diagnose()},
}))
'''


@pytest.fixture(scope="module")
def without_cuda_wheels() -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run([sys.executable, "-c", NO_CUDA_WHEELS], capture_output=True,
                          text=True, env=env, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _gaps() -> str:
    return ", ".join(regions_module.seed_schedule_gaps())


def test_nv_without_the_cuda_wheels_runs_bob_s_own_regions_and_says_so(without_cuda_wheels):
    kernels, own_only, names, reason = without_cuda_wheels["nv"]
    assert without_cuda_wheels["loaded"] == []  # nothing of cuda-bindings or NVRTC loaded
    assert (kernels, own_only, names) == ("own", True, sorted(OWN_REGIONS))
    refused = f": a plan needing {_gaps()} is refused ({CUDA_EXTRA})" if _gaps() else ""
    assert reason == (f"{FAKE_GPU}; Bob's own machine code ({OWN_LIST}); NVRTC is not "
                      f"installed{refused}")


def test_auto_without_the_cuda_wheels_passes_cuda_by_and_says_why(without_cuda_wheels):
    name, reason = without_cuda_wheels["auto"]
    cuda_why = "the cuda backend cannot run here: cuda-bindings is not installed"
    assert reason.startswith(cuda_why) and "\n" not in reason
    if _gaps():  # own code lacks regions the seed schedule runs: cpu runs every run
        assert name == "cpu"
        assert reason.endswith(f"; the nv backend runs Bob's own machine code alone here (no "
                               f"NVRTC), which has none for {_gaps()}")
    else:
        assert name == "nv" and f"; nv: {FAKE_GPU}; Bob's own machine code" in reason


def test_doctor_without_the_cuda_wheels_says_nv_runs_bob_s_own_code(without_cuda_wheels):
    rows = without_cuda_wheels["doctor"]
    assert rows["nv"].startswith(f"{FAKE_GPU}; Bob's own machine code ({OWN_LIST}); NVRTC is "
                                 "not installed")
    assert rows["nv"].endswith("; the kernel module")
    assert rows["cuda"].startswith("the cuda backend cannot run here: cuda-bindings is not "
                                   "installed")


# -- the chooser, in this process: NVRTC's regions faked or refused ----------------------------


@pytest.fixture
def fake_nv(monkeypatch) -> None:
    from bob.backends.nv.rm import backend as nv_backend

    monkeypatch.setattr(nv_backend, "nv_available", lambda: (True, FAKE_GPU))


def _nvrtc(monkeypatch, compiled) -> None:
    from bob.kernels.cuda import regions as cuda_regions

    monkeypatch.setattr(cuda_regions, "compiled_regions", compiled)


def _raise(error: Exception):
    def compiled(arch):
        raise error
    return compiled


def test_nv_with_nvrtc_keeps_nvrtc_s_kernels_and_names_bob_s(fake_nv, monkeypatch):
    nvrtc_regions = {sig.HEALTH: sig.declared_region(sig.HEALTH)}
    _nvrtc(monkeypatch, lambda arch: nvrtc_regions)
    choice = registry.choose_backend("nv")
    assert (choice.kernels, choice.own_only, choice.regions) == ("nvrtc", False, nvrtc_regions)
    assert choice.reason == f"{FAKE_GPU}; NVRTC's kernels (--kernels own: Bob's own {OWN_LIST})"
    mixed = registry.choose_backend("nv", kernels="own")  # Bob's where it has them
    assert (mixed.kernels, mixed.own_only) == ("own", False)
    assert set(mixed.regions) == {sig.HEALTH, *OWN_REGIONS}


@pytest.mark.parametrize(("error", "why"), [
    (ImportError("No module named 'cuda'"), "NVRTC is not installed"),
    (BadInput("nvrtcCompileProgram failed: NVRTC_ERROR_COMPILATION\nthe log"),
     "NVRTC failed: nvrtcCompileProgram failed: NVRTC_ERROR_COMPILATION the log"),
])
def test_nv_without_nvrtc_chooses_itself_with_bob_s_own_regions(fake_nv, monkeypatch, error,
                                                                 why):
    _nvrtc(monkeypatch, _raise(error))
    for kernels in ("nvrtc", "own"):
        choice = registry.choose_backend("nv", kernels=kernels)
        assert (choice.name, choice.kernels, choice.own_only) == ("nv", "own", True)
        assert set(choice.regions) == set(OWN_REGIONS)
        assert all(region.code for region in choice.regions.values())
        assert f"{FAKE_GPU}; Bob's own machine code ({OWN_LIST}); {why}" in choice.reason


def test_auto_picks_nv_on_own_code_where_cuda_cannot_run_and_own_code_has_the_seed_s_regions(
        fake_nv, monkeypatch):
    def no_cuda(arch, arena):
        raise BackendUnavailable("the cuda backend needs cuda-bindings and NVRTC")

    monkeypatch.setitem(registry._BY_NAME, "cuda", replace(registry.spec("cuda"),
                                                            choose=no_cuda))
    _nvrtc(monkeypatch, _raise(ImportError("No module named 'cuda'")))
    monkeypatch.setattr(regions_module, "seed_schedule_gaps", lambda: (sig.HEALTH,))
    passed = registry.choose_backend("auto")
    assert (passed.name, passed.reason) == (
        "cpu", "the cuda backend needs cuda-bindings and NVRTC; the nv backend runs Bob's own "
               "machine code alone here (no NVRTC), which has none for bob-health")
    monkeypatch.setattr(regions_module, "seed_schedule_gaps", lambda: ())
    picked = registry.choose_backend("auto")
    assert (picked.name, picked.kernels, picked.own_only) == ("nv", "own", True)
    assert picked.reason == (f"the cuda backend needs cuda-bindings and NVRTC; nv: {FAKE_GPU}; "
                             f"Bob's own machine code ({OWN_LIST}); NVRTC is not installed")
    assert registry.availability("auto").details == "picks nv"


def test_doctor_says_nv_runs_nvrtc_s_kernels_where_nvrtc_is_installed(fake_nv, monkeypatch):
    from bob.host import doctor

    _nvrtc(monkeypatch, lambda arch: {})
    monkeypatch.setattr(doctor, "_kernel_module", lambda: "the kernel module")
    (row,) = [row for row in doctor.diagnose() if row["backend"] == "nv"]
    assert row == {"backend": "nv", "usable": True, "details": (
        f"{FAKE_GPU}; NVRTC's kernels (--kernels own: Bob's own {OWN_LIST}); the kernel module")}


# -- coverage: the rule and its one line -----------------------------------------------------


def test_uncovered_names_each_region_own_code_does_not_run_at_v(monkeypatch):
    plan = (sig.GATHER, sig.FUSED_HARD, sig.HEALTH, sig.FUSED_HARD)
    assert uncovered(plan, 256) == tuple(name for name in (sig.FUSED_HARD, sig.HEALTH)
                                         if not own.covers(name, 256))
    monkeypatch.setitem(own.BUILDERS, sig.FUSED_HARD, own.BUILDERS[sig.ADAMW])
    monkeypatch.setitem(own.VOCAB_LIMITS, sig.FUSED_HARD, 1024)
    assert sig.FUSED_HARD not in uncovered(plan, 1024)
    assert sig.FUSED_HARD in uncovered(plan, 1025)


def test_a_refusal_names_the_regions_v_and_the_ways_out(monkeypatch):
    monkeypatch.delitem(own.BUILDERS, sig.HEALTH, raising=False)
    for name in (sig.FUSED_WIDE_HARD, sig.COLLAPSED_GATHER, sig.COLLAPSED_FUSED_HARD):
        monkeypatch.delitem(own.BUILDERS, name, raising=False)
    plan = (sig.LOSS_HARD, sig.FUSED_WIDE_HARD, sig.HEALTH)
    assert coverage_refusal(plan, 4096) == (
        "--kernels own: Bob has no own machine code for bob-fused-train-wide (V = 4096); use "
        "--kernels nvrtc or --schedule seed")  # the health check: NVRTC's
    assert coverage_refusal(plan, 4096, nvrtc=False) == (
        "nv runs Bob's own machine code here (NVRTC is not installed), and Bob has none for "
        "bob-fused-train-wide, bob-health (V = 4096): pip install 'bob-bigram[cuda]'")
    assert coverage_refusal((sig.LOSS_HARD, sig.HEALTH), 256) is None
    assert coverage_refusal((sig.COLLAPSED_GATHER, sig.COLLAPSED_FUSED_HARD), 256) == (
        "--kernels own: Bob has no own machine code for bob-collapsed-gather, "
        "bob-collapsed-fused-train (V = 256); use --kernels nvrtc or --tables dense")


def test_a_shared_region_bob_has_code_for_must_serve_the_plan_s_v(monkeypatch):
    monkeypatch.setitem(own.BUILDERS, sig.HEALTH, own.BUILDERS[sig.ADAMW])
    monkeypatch.setitem(own.VOCAB_LIMITS, sig.HEALTH, 512)
    assert coverage_refusal((sig.LOSS_HARD, sig.HEALTH), 512) is None
    assert coverage_refusal((sig.LOSS_HARD, sig.HEALTH), 1024) == (
        "--kernels own: Bob has no own machine code for bob-health (V = 1024); use --kernels "
        "nvrtc")


def test_the_collapsed_refusal_follows_own_code(monkeypatch):
    """Bob has every collapsed kernel, the fused ones included: --tables collapsed is refused
    for none of them; without its fused kernel a fused collapsed plan is refused naming it
    (and auto takes seed)."""
    assert all(name in own.BUILDERS for name in sig.COLLAPSED_REGIONS)
    assert regions_module.collapsed_refusal() is None
    plan = [sig.COLLAPSED_FUSED_CORPUS, sig.COLLAPSED_GATHER, sig.ARGMAX]
    assert regions_module.coverage_refusal(plan, 4096) is None
    monkeypatch.delitem(own.BUILDERS, sig.COLLAPSED_FUSED_CORPUS)
    assert regions_module.collapsed_refusal() is None
    fused = regions_module.coverage_refusal(plan, 4096)
    assert fused is not None and sig.COLLAPSED_FUSED_CORPUS in fused


def test_a_session_on_own_code_alone_refuses_a_plan_before_opening_a_backend(monkeypatch):
    from bob.host.session import Session

    monkeypatch.delitem(own.BUILDERS, sig.HEALTH, raising=False)
    opened = []
    choice = BackendChoice("nv", SM90, None, opened.append, "own code alone", kernels="own",
                           own_only=True)
    config = BobConfig(vocab=64, prompts=0, updates=2)
    with pytest.raises(BadInput, match=r"^nv runs Bob's own machine code here \(NVRTC is not "
                                       r"installed\), and Bob has none for bob-health \(V = "
                                       r"64\): pip install 'bob-bigram\[cuda\]'$"):
        Session(choice).plan_for(config)
    with pytest.raises(BadInput):
        own_code.require_covered(choice, config)
    assert opened == []
    assert own_code.covers(replace(choice, kernels="own", own_only=False), config)


# -- bob train on nv-sim with --kernels own ----------------------------------------------------


def _wide_refusal(region: str) -> str:
    return (f"bob: --kernels own: Bob has no own machine code for {region} (V = 4096); use "
            "--kernels nvrtc or --schedule seed\n")


def test_a_plan_outside_coverage_is_refused_before_its_data_is_read(tmp_path, capsys,
                                                                     monkeypatch):
    from bob.host import training

    monkeypatch.setattr(training, "request_data",
                        lambda *args, **kwargs: pytest.fail("the data was read"))
    tokens = tmp_path / "t.bin"
    tokens.write_bytes(np.arange(100, dtype=np.uint16).tobytes())
    before = contents(tmp_path)
    checkpoint = tmp_path / "c.safetensors"
    assert main(["train", "--tokens", str(tokens), "--vocab", "4096", "--backend", "nv-sim",
                 "--kernels", "own", "--schedule", "fused", "--steps", "2",
                 "-c", str(checkpoint)]) == 2
    captured = capsys.readouterr()
    assert captured.err == _wide_refusal("bob-fused-train-wide-corpus")
    assert captured.out == "" and contents(tmp_path) == before  # no checkpoint, no lock


def test_a_plan_outside_coverage_is_refused_once_the_data_says_its_v(tmp_path, capsys,
                                                                     monkeypatch):
    record = tmp_path / "r.bob"
    InputRecord.hard(np.arange(1, 4097, dtype=np.uint32) % 4096).write(record)
    before = contents(tmp_path)
    argv = ["train", "--input", str(record), "--backend", "nv-sim", "--kernels", "own",
            "--schedule", "fused", "--steps", "2", "-c", str(tmp_path / "c.safetensors"),
            "--result", str(tmp_path / "out.bob")]
    assert main([*argv, "--tables", "dense"]) == 2
    captured = capsys.readouterr()
    assert captured.err == _wide_refusal("bob-fused-train-wide")
    assert captured.out == "" and contents(tmp_path) == before
    # the data names 4096 of 4096^2 cells: auto holds collapsed tables; without Bob's own
    # collapsed fused kernel, that plan is refused too
    monkeypatch.delitem(own.BUILDERS, sig.COLLAPSED_FUSED_HARD)
    monkeypatch.setattr(regions_module, "OWN_REGIONS", tuple(own.BUILDERS))
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err == ("bob: --kernels own: Bob has no own machine code for "
                            "bob-collapsed-fused-train (V = 4096); use --kernels nvrtc or "
                            "--schedule seed or --tables dense\n")
    assert captured.out == "" and contents(tmp_path) == before


def _train(tmp_path: Path, text: Path, backend: str, *argv: str) -> tuple[bytes, str]:
    checkpoint = tmp_path / f"{backend}-{len(argv)}.safetensors"
    assert main(["train", "--text", str(text), "--backend", backend, "--steps", "3", "-N", "2",
                 "-c", str(checkpoint), "--json", *argv]) == 0
    return checkpoint.read_bytes(), checkpoint.name


def test_own_kernels_on_nv_sim_give_the_cpu_backend_s_bytes_on_the_seed_schedule(
        tmp_path, text, capsys):
    cpu, _ = _train(tmp_path, text, "cpu", "--schedule", "seed")
    own_seed, _ = _train(tmp_path, text, "nv-sim", "--kernels", "own", "--schedule", "seed")
    assert own_seed == cpu


def test_own_kernels_where_own_code_covers_the_fused_plan_run_it_with_auto(
        tmp_path, text, capsys, monkeypatch):
    assert own.covers(sig.FUSED_CORPUS, 256)  # the register-resident kernel's own code
    cpu, _ = _train(tmp_path, text, "cpu", "--schedule", "seed")
    capsys.readouterr()
    fused, _ = _train(tmp_path, text, "nv-sim", "--kernels", "own")
    report = json.loads(capsys.readouterr().out)
    assert (report["schedule"], report["schedule_reason"]) == (
        "fused", "auto: the seed schedule's bytes, faster")
    assert fused == cpu
    monkeypatch.setitem(own.VOCAB_LIMITS, sig.FUSED_CORPUS, 128)  # V = 256 is past it
    seed, _ = _train(tmp_path, text, "nv-sim", "--kernels", "own", "--overwrite")
    report = json.loads(capsys.readouterr().out)
    assert (report["schedule"], report["schedule_reason"]) == (
        "seed", "auto: Bob's own code has no fused kernel for the run")
    assert seed == cpu


def test_check_and_plan_with_own_code_take_the_fused_schedule_where_it_covers(
        capsys):
    assert own.covers(sig.FUSED_HARD, 64)
    assert main(["check", "--backends", "nv-sim,cpu", "--kernels", "own", "--schedule",
                 "fused", "-V", "64", "--steps", "2", "-N", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["identical"] is True
    assert main(["plan", "--kernels", "own", "-N", "2"]) == 0
    assert ("schedule: seed shown (the reference); bob train on nv runs fused (auto: the "
            "seed schedule's bytes, faster)") in capsys.readouterr().err.splitlines()


def test_collapsed_tables_run_on_own_code_on_both_schedules(tmp_path, text, capsys):
    """Bob has the collapsed tables' kernels of both schedules: --tables collapsed with
    --kernels own runs fused under auto and seed when asked, the cpu's bytes both ways."""
    cpu, _ = _train(tmp_path, text, "cpu", "--schedule", "seed", "--tables", "collapsed")
    capsys.readouterr()
    fused, _ = _train(tmp_path, text, "nv-sim", "--kernels", "own", "--tables", "collapsed")
    report = json.loads(capsys.readouterr().out)
    assert (report["tables"], report["schedule"], report["schedule_reason"]) == (
        "collapsed", "fused", "auto: the seed schedule's bytes, faster")
    assert fused == cpu
    seed, _ = _train(tmp_path, text, "nv-sim", "--kernels", "own", "--tables", "collapsed",
                     "--schedule", "seed", "--overwrite")
    assert json.loads(capsys.readouterr().out)["schedule"] == "seed"
    assert seed == cpu
