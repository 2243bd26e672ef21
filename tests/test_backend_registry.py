"""The backend registry (bob.backends.registry): one spec per backend, and every list of
backends the other layers use derived from it: the command line's choices, auto's order,
the rows of `bob doctor`, the backends `bob profile` times, the plan `bob plan` shows,
the names the executable warms the CUDA driver for, and the chained default.

    PYTHONPATH=src .venv/bin/python -m pytest -q tests/test_backend_registry.py
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from bob.backends import registry
from bob.errors import BackendUnavailable, BadInput


def _choices(command, name: str) -> tuple[str, ...]:
    (option,) = [p for p in command.params if p.name == name]
    return tuple(option.type.choices)


def test_every_spec_is_named_once_and_says_what_it_is():
    names = [spec.name for spec in registry.SPECS]
    assert len(set(names)) == len(names) and registry.AUTO not in names
    assert all(spec.description and "\n" not in spec.description for spec in registry.SPECS)
    assert registry.BACKEND_NAMES == (*names, registry.AUTO)


def test_the_command_lines_choices_are_the_registrys():
    from bob.cli import profile_cmd, run_cmd, tools_cmd

    for command in (run_cmd.train, run_cmd.predict, run_cmd.generate):
        assert _choices(command, "backend") == registry.BACKEND_NAMES
    assert _choices(profile_cmd.profile, "backend_name") == registry.PROFILED_BACKENDS
    assert registry.PROFILED_BACKENDS == tuple(
        spec.name for spec in registry.SPECS if spec.profile_method)
    assert tools_cmd._CHOICES == registry.BACKENDS  # check compares two named backends


def test_auto_tries_the_ranked_backends_in_order_and_says_why_it_passed_one_over(monkeypatch):
    assert registry.AUTO_ORDER == ("cuda", "nv", "cpu")

    def unusable(name: str):
        def choose(arch: str, arena: str):
            raise BackendUnavailable(f"the {name} backend cannot run here: no GPU in this test")
        return choose

    cuda, nv = registry.spec("cuda"), registry.spec("nv")
    monkeypatch.setitem(registry._BY_NAME, "cuda", replace(cuda, choose=unusable("cuda")))
    monkeypatch.setitem(registry._BY_NAME, "nv", replace(nv, choose=unusable("nv")))
    choice = registry.choose_backend("auto")
    assert (choice.name, choice.reason) == (
        "cpu", "the cuda backend cannot run here: no GPU in this test; the nv backend cannot "
               "run here: no GPU in this test")
    assert registry.availability("auto").details == "picks cpu"
    cpu = registry.spec("cpu")
    monkeypatch.setitem(registry._BY_NAME, "cuda", replace(cuda, choose=cpu.choose))
    assert registry.choose_backend("auto").reason == "a GPU is usable"


def test_doctor_has_a_row_per_name_and_names_the_kernel_module_beside_gpu_backends(monkeypatch):
    from bob.host import doctor

    monkeypatch.setattr(doctor, "_kernel_module", lambda: "the kernel module")
    rows = doctor.diagnose()
    assert [row["backend"] for row in rows] == list(registry.BACKEND_NAMES)
    for row in rows:
        on_gpu = row["backend"] != registry.AUTO and registry.spec(row["backend"]).on_gpu
        assert row["details"].endswith("; the kernel module") is on_gpu, row


def test_the_executable_warms_the_cuda_driver_for_the_registrys_names():
    from bob.cli import warmup

    assert warmup.CUDA_BACKENDS == registry.CUDA_DRIVER_NAMES == {"cuda", "auto"}
    for name in registry.BACKEND_NAMES:
        assert warmup.wanted(["train", "--backend", name]) is (
            name in registry.CUDA_DRIVER_NAMES)


def test_chained_plans_go_to_the_backends_that_run_the_command_stream():
    from bob.cli import plan_cmd

    for spec in registry.SPECS:
        want = "chained" if spec.runs_command_stream else "per-launch"
        assert registry.resolve_submission("auto", spec.name) == want
    assert registry.STREAM_BACKENDS == ("nv-sim", "nv")
    assert registry.spec(plan_cmd.STREAM_BACKEND).on_gpu  # `bob plan` shows the GPU's plan


def test_unknown_names_and_arena_placements_are_bad_input():
    from bob.backends.cuda import CudaBackend
    from bob.backends.nv.rm.backend import NvBackend
    from bob.kernels.cuda.regions import CompiledRegions
    from bob.program.bob import BobConfig, build_plan
    from nv_fakes import FakeTransport

    with pytest.raises(BadInput, match="unknown backend 'gpu'; choose one of cpu, cuda"):
        registry.choose_backend("gpu")
    with pytest.raises(BadInput, match="unknown backend 'auto'"):
        registry.spec("auto")
    message = "unknown arena placement 'disk'; choose device or host"
    with pytest.raises(BadInput, match=message):
        registry.choose_backend("cpu", arena="disk")
    plan = build_plan(BobConfig(vocab=64, prompts=0, updates=1))
    with pytest.raises(BadInput, match=message):  # before any driver call
        CudaBackend(plan, CompiledRegions(b"", {}), arena="disk")
    with pytest.raises(BadInput, match=message):
        NvBackend(plan, arena="disk", transport=FakeTransport({}))
