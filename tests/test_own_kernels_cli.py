"""--kernels own|nvrtc on the command line: Bob's own machine code on nv and nv-sim, for the
plans it covers; every other combination refused in one line before any work, nothing
written.

nv-sim runs the reference kernels from the command stream's bytes, so these tests check the
plumbing (the plan carries Bob's own code, the stream places it); the GPU runs the code
itself in tests/test_own_kernels_gpu.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bob.backends import choose_backend
from bob.backends.nv.encoder import encode
from bob.cli.main import main
from bob.kernels import own
from bob.kernels.own_regions import OWN_REGIONS, own_listing
from bob.plan.placement import SM90
from bob.program.bob import build_plan
from conftest import bob_config

CUDA_REFUSED = ("bob: --kernels own runs on nv-sim and nv (Bob's command stream); the cuda "
                "backend loads NVRTC's cubin and stays on NVRTC's kernels")
CPU_REFUSED = ("bob: --kernels own runs on nv-sim and nv; the cpu backend runs the NumPy "
               "reference, no machine code")
AUTO_REFUSED = ("bob: --kernels own runs on nv-sim and nv: name one with --backend (auto "
                "picks cuda, nv or cpu)")
# V = 4096 runs the wide fused kernels, which Bob has no own code for.
WIDE_REFUSED = ("bob: --kernels own: Bob has no own machine code for {} (V = 4096); use "
                "--kernels nvrtc or --schedule seed")


def test_nv_sim_with_own_kernels_places_bob_s_code():
    choice = choose_backend("nv-sim", kernels="own")
    assert set(choice.regions) == set(OWN_REGIONS)
    assert "Bob's own machine code for" in choice.reason
    plan = build_plan(bob_config(vocab=256, prompts=1, updates=2), choice.target,
                      compiled=choice.regions)
    program = next(c for c in encode(plan).components if c.name == "program")
    for placed in plan.placed_regions:
        if placed.name in choice.regions:
            start = placed.address - program.base
            assert bytes(program.data[start:start + placed.bytes]) == \
                own.image(placed.name, "sm_90").code
    assert choose_backend("nv-sim").regions is None  # nvrtc: the declared regions


@pytest.mark.parametrize("mode", ["hard", "corpus"])
def test_check_with_own_kernels_on_nv_sim_agrees_with_the_cpu(mode, capsys):
    assert main(["check", "--backends", "nv-sim,cpu", "--kernels", "own", "--mode", mode,
                 "-V", "64", "--steps", "3", "-N", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["identical"] is True and report["kernels"] == "own"


def test_train_with_own_kernels_on_nv_sim_writes_nvrtc_s_checkpoint(tmp_path, capsys):
    text = tmp_path / "a.txt"
    text.write_bytes(b"the quick brown fox jumps over the lazy dog\n" * 4)
    checkpoints = []
    for kernels in ("own", "nvrtc"):
        checkpoint = tmp_path / f"{kernels}.safetensors"
        assert main(["train", "--text", str(text), "--backend", "nv-sim", "--kernels", kernels,
                     "--steps", "3", "-N", "2", "-c", str(checkpoint)]) == 0, \
            capsys.readouterr().err
        checkpoints.append(checkpoint.read_bytes())
    assert checkpoints[0] == checkpoints[1]


def test_plan_disasm_lists_bob_s_own_instructions(capsys):
    assert main(["plan", "--kernels", "own", "-N", "1", "-P", "1", "--disasm"]) == 0
    out = capsys.readouterr().out
    # bob plan shows the seed schedule: its hard plan places these, and health
    hard = (*(name for name in OWN_REGIONS if name in own.seed.BUILDERS
              and name != "bob-loss-gradient-corpus"), "bob-health")
    assert out.endswith(own_listing(SM90, hard) + "\n")
    assert "QMD V04_00 at" in out  # the command stream first, for sm_90
    assert out.count("EXIT ;") >= len(hard)


def test_plan_json_carries_the_own_code(capsys):
    assert main(["plan", "--kernels", "own", "-N", "1", "--json"]) == 0
    regions = {r["name"]: r for r in json.loads(capsys.readouterr().out)["regions"]}
    assert regions["bob-adamw"]["code"] == own.image("bob-adamw", "sm_90").code.hex()
    for name, region in regions.items():  # a region with no own code: NVRTC's, with --arch
        assert region["code"] == (own.image(name, "sm_90").code.hex()
                                  if name in own.BUILDERS else ""), name


def test_plan_without_own_kernels_disassembles_no_instructions(capsys):
    assert main(["plan", "-N", "1", "-P", "1", "--disasm"]) == 0
    assert "instructions, " not in capsys.readouterr().out


@pytest.mark.parametrize(("argv", "message"), [
    (["train", "--kernels", "own"], AUTO_REFUSED),
    (["train", "--kernels", "own", "--backend", "cuda"], CUDA_REFUSED),
    (["train", "--kernels", "own", "--backend", "cpu"], CPU_REFUSED),
    (["train", "--kernels", "own", "--backend", "nv-sim", "--schedule", "fused", "--tokens",
      "a.txt", "--vocab", "4096"], WIDE_REFUSED.format("bob-fused-train-wide-corpus")),
    (["check", "--kernels", "own", "--backends", "cpu,cuda"], CUDA_REFUSED),
    (["check", "--kernels", "own", "--backends", "nv-sim,cuda"], CUDA_REFUSED),
    (["check", "--kernels", "own", "--backends", "cpu,cpu"], CPU_REFUSED),
    (["check", "--kernels", "own", "--backends", "cpu,nv-sim", "--schedule", "fused", "-V",
      "4096"], WIDE_REFUSED.format("bob-fused-train-wide")),
    (["plan", "--kernels", "own", "--schedule", "fused", "--emit", "components", "-V", "4096"],
     WIDE_REFUSED.format("bob-fused-train-wide")),
    (["bench", "--kernels", "own", "--backend", "cpu", "--save", "bench.json"],
     "bob: --kernels own adds rows of Bob's own kernels beside the nv rows, which run beside "
     "cuda's table only: give --backend cuda"),
    (["bench", "--kernels", "own"],
     "bob: --kernels own adds rows of Bob's own kernels beside the nv rows, which run beside "
     "cuda's table only: give --backend cuda"),
    (["train", "--kernels", "ptxas"], "bob train: Invalid value for '--kernels': 'ptxas' is "
                                      "not one of 'nvrtc', 'own'. (see bob train --help)"),
])
def test_a_refusal_is_one_line_before_any_work(argv, message, tmp_path: Path, monkeypatch,
                                               capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.txt").write_bytes(b"abc")
    extra = ["-c", "m.safetensors"] if argv[0] == "train" else []
    if argv[0] == "train" and "--tokens" not in argv:
        extra += ["--text", "a.txt"]
    assert main([*argv, *extra]) == 2
    captured = capsys.readouterr()
    assert captured.err.strip().splitlines()[-1] == message
    assert "Traceback" not in captured.err and captured.out == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt"]  # nothing written


def test_plan_shards_refuse_own_kernels(tmp_path: Path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["plan", "--kernels", "own", "--shards", "2", "-V", "64"]) == 2
    captured = capsys.readouterr()
    assert captured.err.strip() == ("bob: row shards (--shards, --device-memory) do not take "
                                    "--kernels own")
    assert captured.out == "" and list(tmp_path.iterdir()) == []
