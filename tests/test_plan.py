"""The plan layer: placement, derived figures, JSON, and every hazard kind."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest

from bob.cli.main import main
from bob.errors import BadInput
from bob.kernels.cuda.regions import catalogue
from bob.plan import SM86, SM90, certify, place
from bob.plan.certificate import (
    HAZARD_KINDS,
    CertificateError,
    CertifiedPlan,
    require_certified,
)
from bob.plan.jsonio import dumps, loads, plan_from_json, plan_to_json
from bob.plan.model import (
    Address,
    Dim3,
    Footprint,
    LaunchSpec,
    PointerParam,
    ProgramSpec,
    Region,
    Scalar,
    ScalarParam,
    Submission,
    TensorRef,
    TensorSpec,
)
from bob.plan.placement import decode_parameter_block, encode_parameter_block
from bob.program.bob import BobConfig, build_plan, build_program, typical_pairs
from conftest import bob_config, bob_plan

# -- derived figures ---------------------------------------------------------

@pytest.mark.parametrize("vocab,prompts,updates", [
    (256, 1, 1), (256, 0, 0), (256, 3, 10), (1024, 5, 2), (8192, 2, 7), (300, 4, 0),
])
@pytest.mark.parametrize("mode", ["hard", "corpus"])
def test_figures_follow_the_seed_formulas(vocab, prompts, updates, mode):
    config = bob_config(vocab=vocab, prompts=prompts, updates=updates, mode=mode)
    for target in (SM86, SM90):
        plan = build_plan(config, target)
        health = int(updates > 0)  # the health check ends a training invocation
        loads = int(mode == "corpus")  # the scatter of the sparse input into `weights`
        launches = loads + 1 + 2 * prompts + 2 * updates + health
        assert plan.launch_count == launches == config.launch_count(target)
        assert plan.submission_count == launches + 2 * prompts == config.submission_count(target)
        assert plan.program_bytes == plan.code_extent + target.parameter_block_bytes * launches
        assert plan.qmd_table_bytes == launches * target.qmd_stride_bytes
        assert target.qmd_stride_bytes == {"sm_86": 256, "sm_90": 512}[target.name]
        assert plan.forward_launches == loads + 1 + 2 * prompts
        assert plan.forward_submissions == loads + 1 + 2 * prompts
        if loads:
            assert plan.launches[0].region == "bob-scatter"
            assert plan.launches[0].label == "scatter->weights"
        for k in range(updates):
            assert plan.launches[config.adamw_launch(k)].region == "bob-adamw"
            assert plan.launches[config.adamw_launch(k)].label == f"adamw[{k}]"
        if health:
            assert plan.launches[-1].region == "bob-health"
            assert plan.launches[-2].label == "loss->training_loss"
        assert certify(plan).holds


def test_code_extent_is_the_retained_code_repacked_at_256_bytes():
    config = BobConfig(prompts=0, updates=2)  # no prompts: gather and argmax are pruned
    code = {name: bytes(size) for name, size in
            (("bob-row-gather", 300), ("bob-loss-gradient", 1000), ("bob-adamw", 513),
             ("bob-greedy-argmax", 10), ("bob-health", 200))}
    program = build_program(config)
    regions = tuple(replace(r, code=code[r.name]) for r in program.regions)
    plan = place(replace(program, regions=regions), SM86)
    assert [p.name for p in plan.placed_regions] == ["bob-loss-gradient", "bob-adamw",
                                                     "bob-health"]
    base = plan.address_map.program.base
    assert [p.address - base for p in plan.placed_regions] == [0, 1024, 1792]
    assert plan.code_extent == 1792 + 256
    assert plan.program_bytes == 2048 + 512 * plan.launch_count
    assert certify(plan).holds


def test_tensors_are_page_aligned_in_declaration_order():
    plan = bob_plan()
    names = [t.name for t in plan.tensors]
    assert names == ["parameters", "first_moment", "second_moment", "gradients", "input",
                     "initial_loss", "training_loss", "logit_rows", "predictions", "health"]
    for before, after in zip(plan.tensors, plan.tensors[1:], strict=False):
        assert after.address % 4096 == 0
        assert after.address == -(-before.end // 4096) * 4096
    assert plan.tensors[0].address == plan.address_map.arena.base


def test_parameter_block_layout_pointers_then_packed_scalars():
    plan = bob_plan()
    launch = plan.launches[0]  # the initial loss: 4 pointers, 3 f32 scalars, 1 u32
    region = plan.region(launch.region)
    block = encode_parameter_block(SM86, region, launch)
    assert len(block) == 512
    assert block[:0x160] == bytes(0x160)
    words = [int.from_bytes(block[0x160 + 8 * i:0x168 + 8 * i], "little") for i in range(4)]
    assert words == [a.address for a in launch.args[:4]]
    assert int.from_bytes(block[0x180:0x184], "little") == 0x3FB8AA3B  # log2 e
    assert int.from_bytes(block[0x184:0x188], "little") == 0x3F317218  # ln 2
    assert int.from_bytes(block[0x188:0x18C], "little") == 0x3B800000  # 1/256
    assert int.from_bytes(block[0x18C:0x190], "little") == 256
    decoded = decode_parameter_block(SM86, region, block)
    assert list(decoded.values()) == list(launch.args)
    sm90 = bob_plan(target=SM90)
    assert len(encode_parameter_block(SM90, region, sm90.launches[0])) == 1024


def test_a_block_refuses_arguments_that_do_not_match_the_parameters():
    plan = bob_plan()
    launch = plan.launches[0]  # pointers first, then scalars
    region = plan.region(launch.region)
    swapped = replace(launch, args=(launch.args[4], *launch.args[1:4], launch.args[0],
                                    *launch.args[5:]))
    with pytest.raises(TypeError, match=f"argument 0 of a '{launch.region}' launch is a "
                                        "pointer parameter given Scalar"):
        encode_parameter_block(SM86, region, swapped)
    as_pointer = replace(launch, args=(*launch.args[:4], Address(0x1000), *launch.args[5:]))
    with pytest.raises(TypeError, match="argument 4 .* is a scalar parameter given Address"):
        encode_parameter_block(SM86, region, as_pointer)
    short = replace(launch, args=launch.args[:-1])
    with pytest.raises(ValueError, match=f"a '{launch.region}' launch has 7 arguments for 8 "
                                         "parameters"):
        encode_parameter_block(SM86, region, short)


def test_json_round_trip_is_exact():
    for mode in ("hard", "corpus"):
        plan = bob_plan(mode=mode)
        again = loads(dumps(plan), regions=catalogue())
        assert again == plan
        assert plan_to_json(again) == plan_to_json(plan)


# -- hazards -------------------------------------------------------------------

def _edit(data: dict, how) -> dict:
    data = json.loads(json.dumps(data))
    how(data)
    return data


def _tensor(data, name):
    return next(t for t in data["tensors"] if t["name"] == name)


def _hexadd(value: str, delta: int) -> str:
    return hex(int(value, 16) + delta)


def _plant_overlap(d):
    _tensor(d, "parameters")["bytes"] += 4096  # its shape grows with it: 4 more columns
    _tensor(d, "parameters")["shape"][1] += 4


def _plant_outside(d):
    d["address_map"]["arena"]["bytes"] -= 8


def _plant_pointer_outside(d):
    gap = int(_tensor(d, "input")["address"], 16) + _tensor(d, "input")["bytes"] + 16
    d["launches"][1]["args"][1]["pointer"] = hex(gap)  # gather[0]'s prompt pointer


def _plant_footprint(d):
    argmax = d["launches"][2]
    argmax["args"][1]["pointer"] = _hexadd(argmax["args"][1]["pointer"], 1024 + 4)  # row of P=2


def _plant_misaligned(d):
    argmax = d["launches"][2]
    argmax["args"][0]["pointer"] = _hexadd(argmax["args"][0]["pointer"], 2)


def _plant_block_overflow(d):
    d["target"]["parameter_block_bytes"] = 384


def _plant_unknown(d):
    d["launches"][3]["region"] = "bob-no-such-kernel"


def _plant_pruned(d):
    d["placed_regions"] = [p for p in d["placed_regions"] if p["name"] != "bob-greedy-argmax"]


def _plant_out_of_order(d):
    s = d["submissions"]
    s[1]["first_launch"], s[2]["first_launch"] = s[2]["first_launch"], s[1]["first_launch"]


def _plant_semaphores(d):
    d["submissions"][3]["semaphore"] = d["submissions"][2]["semaphore"]


PLANTED = {
    "tensor-overlap": _plant_overlap,
    "tensor-outside-arena": _plant_outside,
    "pointer-outside-tensors": _plant_pointer_outside,
    "footprint-overflow": _plant_footprint,
    "misaligned": _plant_misaligned,
    "parameter-block-overflow": _plant_block_overflow,
    "unknown-region": _plant_unknown,
    "pruned-region": _plant_pruned,
    "submission-order": _plant_out_of_order,
    "semaphore-order": _plant_semaphores,
}


def test_the_good_plan_is_certified():
    certificate = certify(bob_plan())
    assert certificate.holds and certificate.hazards == ()


@pytest.mark.parametrize("kind", sorted(PLANTED))
def test_planted_hazard_is_reported_alone_through_the_api(kind):
    data = _edit(plan_to_json(bob_plan()), PLANTED[kind])
    certificate = certify(plan_from_json(data, regions=catalogue()))
    assert certificate.kinds() == {kind}, [str(h) for h in certificate.hazards]
    assert kind in HAZARD_KINDS
    with pytest.raises(CertificateError, match=kind):
        require_certified(plan_from_json(data, regions=catalogue()))


def test_a_certified_plan_comes_only_from_certifying():
    plan = bob_plan()
    certified = require_certified(plan)
    assert certified.plan is plan
    assert require_certified(certified) is certified  # certified once, never again
    with pytest.raises(TypeError, match="only from require_certified"):
        CertifiedPlan(plan)


def test_a_failed_certificate_is_bad_input_in_one_line():
    data = _edit(plan_to_json(bob_plan()), PLANTED["tensor-overlap"])
    with pytest.raises(CertificateError) as caught:
        require_certified(plan_from_json(data, regions=catalogue()))
    assert isinstance(caught.value, BadInput) and caught.value.exit_status == 2
    assert "\n" not in str(caught.value)
    assert str(caught.value).startswith("the plan is not certified: tensor-overlap: ")


@pytest.mark.parametrize("kind", sorted(PLANTED))
def test_planted_hazard_is_reported_by_bob_certify(kind, tmp_path, capsys):
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(_edit(plan_to_json(bob_plan()), PLANTED[kind])))
    assert main(["certify", "--plan", str(path), "--json"]) == 1
    verdict = json.loads(capsys.readouterr().out)
    assert verdict["certified"] is False
    assert {h["kind"] for h in verdict["hazards"]} == {kind}
    assert main(["certify", "--plan", str(path)]) == 1
    assert kind in capsys.readouterr().out


def test_hazard_reports_name_launch_argument_tensor_and_addresses():
    data = _edit(plan_to_json(bob_plan()), _plant_footprint)
    (hazard,) = certify(plan_from_json(data, regions=catalogue())).hazards
    assert hazard.launch == 2 and hazard.argument == "row" and hazard.tensor == "logit_rows"
    start, end, tensor_end = hazard.addresses
    assert end - start == 1024 and tensor_end == int(_tensor(data, "logit_rows")["address"], 16) \
        + 2048
    assert "argmax[0]" in hazard.message and "0x" in hazard.message


def test_footprints_depend_on_the_launch():
    # The gather reads the whole table: a table pointer one row in overflows.
    data = plan_to_json(bob_plan())
    data["launches"][1]["args"][2]["pointer"] = _hexadd(data["launches"][1]["args"][2]["pointer"],
                                                        1024)
    (hazard,) = certify(plan_from_json(data, regions=catalogue())).hazards
    assert hazard.kind == "footprint-overflow" and hazard.argument == "table"


def test_every_hazard_of_a_plan_is_listed():
    data = plan_to_json(bob_plan())
    for kind in ("tensor-overlap", "unknown-region", "semaphore-order"):
        PLANTED[kind](data)
    assert certify(plan_from_json(data, regions=catalogue())).kinds() == {
        "tensor-overlap", "unknown-region", "semaphore-order"}


def test_a_launch_naming_an_undeclared_tensor_cannot_be_placed():
    region = Region("touch", params=(PointerParam("x", Footprint(4, ("n",))),
                                     ScalarParam("n", "u32")))
    program = ProgramSpec(
        regions=(region,), tensors=(TensorSpec("x", "f32", (4,)),),
        launches=(LaunchSpec("touch", Dim3(1), Dim3(256), (TensorRef("y"), Scalar.u32(4)),
                             "touch y"),),
        submissions=(Submission(0, 1, 1),))
    with pytest.raises(BadInput) as caught:
        place(program, SM90)
    assert caught.value.exit_status == 2
    assert str(caught.value) == ("launch 'touch y' names tensor 'y', which the program "
                                 "does not declare")


def test_a_generic_program_with_its_own_regions():
    """The plan layer knows nothing of bigrams: any program places and certifies."""
    scale = Region("scale", b"\x00" * 40, 16, 128, 0, (
        PointerParam("x", Footprint(4, ("n",)), "readwrite"),
        ScalarParam("factor", "f32"), ScalarParam("n", "u32")))
    program = ProgramSpec(
        regions=(scale,),
        tensors=(TensorSpec("x", "f32", (1000,)),),
        launches=(LaunchSpec("scale", Dim3(8), Dim3(128),
                             (TensorRef("x"), Scalar.f32(2.0), Scalar.u32(1000))),
                  LaunchSpec("scale", Dim3(8), Dim3(128),
                             (TensorRef("x", 4), Scalar.f32(2.0), Scalar.u32(1000)))),
        submissions=(Submission(0, 2, 1),),
    )
    certificate = certify(place(program, SM90))
    assert certificate.kinds() == {"footprint-overflow"}
    assert certificate.hazards[0].launch == 1


def test_bad_plan_files_are_rejected_with_the_path(tmp_path, capsys):
    cases = {
        "notjson.json": ("{", "not valid JSON"),
        "other.json": ('{"format": "something"}', "not a Bob plan"),
        "future.json": ('{"format": "bob-plan", "version": 99}', "version 99"),
    }
    for name, (text, message) in cases.items():
        path = tmp_path / name
        path.write_text(text)
        assert main(["certify", "--plan", str(path)]) == 2
        err = capsys.readouterr().err
        assert message in err and str(path) in err
    data = plan_to_json(bob_plan())
    del data["launches"][0]["args"]
    path = tmp_path / "missing.json"
    path.write_text(json.dumps(data))
    assert main(["certify", "--plan", str(path)]) == 2
    assert "launches[0].args: missing" in capsys.readouterr().err
    assert main(["certify", "--plan", str(tmp_path / "absent.json")]) == 2


def test_bob_certify_default_and_plan_json(capsys):
    assert main(["certify"]) == 0
    assert "certified" in capsys.readouterr().out
    assert main(["plan", "--json", "-V", "512", "-P", "2", "-N", "4", "--mode", "corpus"]) == 0
    plan = loads(capsys.readouterr().out, regions=catalogue())
    # the scatter, the initial loss, 2P predictions, 2N training launches, the health check
    assert plan.launch_count == 1 + 1 + 4 + 8 + 1 and plan.tensor("parameters").shape == (512, 512)
    assert plan.attributes["pairs"] == typical_pairs(512)  # no corpus given: a typical K
    assert main(["plan", "-N", "2"]) == 0
    out = capsys.readouterr().out
    for heading in ("Arena", "Regions", "Launches", "Submissions", "Totals"):
        assert heading in out


def test_scalar_args_keep_their_bits():
    plan = bob_plan()
    adam = plan.launches[5]
    assert isinstance(adam.args[0], Address)
    assert all(isinstance(a, Scalar) for a in adam.args[4:])


def test_adam_scalars_are_the_float64_values_rounded_exactly():
    from fractions import Fraction

    from bob.kernels.exact import f32_bits_from_fraction
    from bob.program.bob import Hyper, adam_scalars

    rng = np.random.default_rng(3)
    for _ in range(200):
        hyper = Hyper(lr=float(10 ** rng.uniform(-6, 1)), beta1=float(rng.uniform(0, 0.99)),
                      beta2=float(rng.uniform(0.9, 0.99999)), eps=float(10 ** rng.uniform(-12, -3)),
                      weight_decay=float(rng.uniform(0, 0.1)))
        step = int(rng.integers(1, 100_000))
        scalars = adam_scalars(hyper, step)
        c1, c2 = 1.0 - hyper.beta1**step, 1.0 - hyper.beta2**step
        expected = {"step_size": hyper.lr * math.sqrt(c2) / c1,
                    "eps_hat": hyper.eps * math.sqrt(c2),
                    "decay": 1.0 - hyper.lr * hyper.weight_decay}
        for name, value in expected.items():
            assert scalars[name].bits == f32_bits_from_fraction(Fraction(value)), name


# Which of Bob's packages each layer may import (docs/ARCHITECTURE.md): downwards only.
ALLOWED_IMPORTS = {
    "plan": {"plan", "errors", "config"},
    "kernels": {"kernels", "isa", "plan", "errors", "config", "files"},
    "backends": {"backends", "kernels", "plan", "errors", "config", "files"},
}


@pytest.mark.parametrize("layer", sorted(ALLOWED_IMPORTS))
def test_layers_import_downwards_only(layer):
    """No backend imports the program, the host or the bring-up tools (at any depth)."""
    import ast
    from pathlib import Path

    import bob

    root = Path(bob.__file__).parent
    found = {}
    for path in (root / layer).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                parts = node.module.split(".")
                if parts[0] == "bob" and len(parts) > 1:
                    found.setdefault(parts[1], set()).add(path.name)
    assert set(found) <= ALLOWED_IMPORTS[layer], {
        package: files for package, files in found.items()
        if package not in ALLOWED_IMPORTS[layer]}
