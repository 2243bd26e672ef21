"""Reading a plan trusts nothing: every refusal through `bob certify --plan`.

Each case edits the JSON of one of Bob's own plans (or its text) and checks the
whole line on stderr, exit status 2, and that nothing was written. Regions come
from Bob's signatures and compiled image: a plan that declares one differently
is refused, naming the region and what differs.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from bob.cli.main import main
from bob.errors import BadInput
from bob.kernels.cuda.regions import catalogue
from bob.kernels.signatures import SIGNATURES
from bob.plan import SM86, SM90, certify, jsonio, place
from bob.plan.jsonio import dumps, loads
from bob.plan.model import (
    Dim3,
    Footprint,
    LaunchSpec,
    PointerParam,
    ProgramSpec,
    Region,
    RegionCatalogue,
    Scalar,
    ScalarParam,
    Submission,
    TensorRef,
    TensorSpec,
)
from bob.program.bob import BobConfig, build_plan

# Bob's plan for V = 256, P = 1, N = 1 on sm_86: launches loss, gather, argmax, adamw, loss;
# regions gather, loss, adamw, argmax.
PLAN = build_plan(BobConfig(prompts=1, updates=1))


def _set(path: str, value):
    """An edit that sets one field, by a path like 'launches[3].grid[0]'."""
    def edit(data):
        *parents, last = _steps(path)
        for step in parents:
            data = data[step]
        data[last] = value
    return edit


def _delete(path: str):
    def edit(data):
        *parents, last = _steps(path)
        for step in parents:
            data = data[step]
        del data[last]
    return edit


def _steps(path: str) -> list:
    steps: list = []
    for part in path.replace("]", "").replace("[", ".").split("."):
        steps.append(int(part) if part.isdigit() else part)
    return steps


def _text(replace_from: str, replace_to: str):
    """An edit of the JSON text itself (for what a dict cannot hold)."""
    def edit(text: str) -> str:
        assert replace_from in text
        return text.replace(replace_from, replace_to, 1)
    edit.on_text = True
    return edit


ADAMW = 2  # regions[2] is bob-adamw
# (edit, the message after "bob: FILE: ")
REFUSALS = {
    # numbers out of range, sizes and counts past the plan
    "negative tensor size": (_set("tensors[4].bytes", -4), "tensors[4].bytes: -4 is below 0"),
    "negative shape": (_set("tensors[0].shape[0]", -1), "tensors[0].shape[0]: -1 is below 0"),
    "negative semaphore": (_set("submissions[2].semaphore", -1),
                           "submissions[2].semaphore: -1 is below 0"),
    "forward launches -1": (_set("forward_launches", -1), "forward_launches: -1 is below 0"),
    "forward launches past the plan": (_set("forward_launches", 7),
                                       "forward_launches: 7 is above the 6 launches"),
    "forward submissions past the plan": (_set("forward_submissions", 9),
                                          "forward_submissions: 9 is above the 8 submissions"),
    "2**70 as a number": (_set("tensors[0].address", 2**70),
                          "tensors[0].address: a 22-digit integer is not below 2**64"),
    "2**70 as hex": (_set("launches[0].args[0].pointer", hex(2**70)),
                     f"launches[0].args[0].pointer: {2**70} is not below 2**64"),
    "5000-digit integer": (_text('"code_extent": 1280', '"code_extent": ' + "9" * 5000),
                           "code_extent: a 5000-digit integer is not below 2**64"),
    "5000-digit hex string": (_set("address_map.arena.base", "0x" + "f" * 5000),
                              "address_map.arena.base: a 5002-character string is not an "
                              "integer below 2**64"),
    "grid -1": (_set("launches[3].grid[0]", -1), "launches[3].grid[0]: -1 is below 1"),
    "grid 0": (_set("launches[1].grid[2]", 0), "launches[1].grid[2]: 0 is below 1"),
    "grid x 2**31": (_set("launches[3].grid[0]", 2**31),
                     "launches[3].grid[0]: 2147483648 is above sm_86's 2147483647"),
    "grid y 65536": (_set("launches[0].grid[1]", 65536),
                     "launches[0].grid[1]: 65536 is above sm_86's 65535"),
    "block x 2048": (_set("launches[0].block[0]", 2048),
                     "launches[0].block[0]: 2048 is above sm_86's 1024"),
    "block z 65": (_set("launches[0].block[2]", 65), "launches[0].block[2]: 65 is above "
                   "sm_86's 64"),
    "2048 threads": (_set("launches[0].block", [256, 8, 1]),
                     "launches[0].block: 256 x 8 x 1 = 2048 threads, above sm_86's 1024 per "
                     "block"),
    "two dimensions": (_set("launches[0].grid", [1, 1]),
                       "launches[0].grid: expected three integers [x, y, z], not 2 items"),
    "region_alignment 0": (_set("region_alignment", 0),
                           "region_alignment: 0 is not a power of two from 1 to 2097152"),
    "region_alignment 3": (_set("region_alignment", 3),
                           "region_alignment: 3 is not a power of two from 1 to 2097152"),
    "page_bytes 0": (_set("page_bytes", 0),
                     "page_bytes: 0 is not a power of two from 1 to 2097152"),
    "pointer align 0": (_set("regions[0].params[0].align", 0),
                        "regions[0].params[0].align: 0 is not a power of two from 1 to 4096"),
    "tensor align 0": (_set("tensors[1].align", 0),
                       f"tensors[1].align: 0 is not a power of two from 1 to {1 << 63}"),
    # bounded nesting
    "deep nesting": (_text('"attributes": {', '"attributes": {"x": ' + "[" * 100_000 + "]"
                           * 100_000 + ", "),
                     "nested more than 8 deep: not a plan (a plan nests at most 7 deep)"),
    "nested attribute": (_set("attributes.vocab", {"a": 1}),
                         "attributes.vocab: expected an integer, not an object"),
    # types
    "boolean integer": (_set("code_extent", True), "code_extent: expected an integer, not true"),
    "float integer": (_set("launches[0].grid[0]", 256.0),
                      "launches[0].grid[0]: expected an integer, not a number"),
    "NaN integer": (_text('"code_extent": 1280', '"code_extent": NaN'),
                    "code_extent: expected an integer, not a number"),
    "not hex": (_set("tensors[0].address", "0xZZ"), "tensors[0].address: '0xZZ' is not an "
                "integer"),
    "loose integer": (_set("tensors[0].address", "1_000"), "tensors[0].address: '1_000' is not "
                      "an integer"),
    "null name": (_set("tensors[0].name", None), "tensors[0].name: expected a string, not null"),
    "empty name": (_set("tensors[0].name", ""), "tensors[0].name: empty name"),
    "label not text": (_set("launches[2].label", 7),
                       "launches[2].label: expected a string, not an integer"),
    "unknown dtype": (_set("tensors[0].dtype", "f64"),
                      "tensors[0].dtype: 'f64' is not one of f32, u32, u8"),
    "bytes not the shape's": (_set("tensors[0].bytes", 4096),
                              "tensors[0].bytes: 4096 is not the 262144 bytes of f32[256, 256]"),
    "tensor past 2**64": (_set("tensors[8].address", hex(2**64 - 2)),
                          "tensors[8]: [0xfffffffffffffffe, +4) ends past 2**64"),
    "tensor named twice": (_set("tensors[1].name", "parameters"),
                           "tensors[1].name: tensor 'parameters' is declared twice"),
    "u32 of 2**32": (_set("launches[0].args[7].u32", 2**32),
                     "launches[0].args[7].u32: 4294967296 is above 2**32 - 1"),
    "f32 bits of 2**32": (_set("launches[0].args[4].f32", hex(2**32)),
                          "launches[0].args[4].f32: 4294967296 is above 2**32 - 1"),
    "two kinds of argument": (_set("launches[0].args[7]", {"u32": 1, "pointer": "0x0"}),
                              "launches[0].args[7]: expected exactly one of 'pointer', 'f32', "
                              "'u32'"),
    "value not the bits": (_set("launches[0].args[4].value", 2.0),
                           "launches[0].args[4].value: 2.0 is not the binary32 0x3fb8aa3b "
                           "(1.4426950216293335); the bits rule: correct or drop 'value'"),
    # unknown and repeated keys
    "unknown top-level key": (_set("extra", 1), "plan: unknown key 'extra'"),
    "unknown launch key": (_set("launches[1].stream", 0), "launches[1]: unknown key 'stream'"),
    "unknown argument key": (_set("launches[1].args[3].note", "x"),
                             "launches[1].args[3]: unknown key 'note'"),
    "unknown figure": (_set("figures.speed", 1), "figures: unknown key 'speed'"),
    "repeated key": (_text('"page_bytes": 4096', '"page_bytes": 4096, "page_bytes": 8192'),
                     "plan: key 'page_bytes' appears twice"),
    "missing key": (_delete("launches[0].args"), "launches[0].args: missing"),
    # the target's facts are Bob's
    "unknown target": (_set("target.name", "sm_100"),
                       "target.name: unknown target 'sm_100' (Bob knows sm_86, sm_90)"),
    "another parameter base": (_set("target.parameter_base", "0x100"),
                               "target.parameter_base: 0x100 is not sm_86's 0x160"),
    "QMD stride off 256": (_set("target.qmd_stride_bytes", 384),
                           "target.qmd_stride_bytes: 384 is not a multiple of 256"),
    # the address map
    "overlapping components": (_set("address_map.qmd-table.base", "0x2000000000"),
                               "address_map.qmd-table.base: 0x2000000000 is inside the component "
                               "before it, which ends at 0x2000001100"),
    "program component too small": (_set("address_map.program.bytes", 1024),
                                     "address_map.program.bytes: 1024 bytes cannot hold the code "
                                     "extent and a parameter block per launch (4352 bytes)"),
    # regions come from Bob's signatures, never from the file
    "shrunk health footprint": (_set("regions[4].params[3].footprint.scale", 8),
                                "regions[4]: region 'bob-health' differs from Bob's own: "
                                "params[3] ('health') footprint is 8 in the plan, 24 in Bob's "
                                "signature"),
    "shrunk footprint": (_set(f"regions[{ADAMW}].params[0].footprint.scale", 1),
                         f"regions[{ADAMW}]: region 'bob-adamw' differs from Bob's own: "
                         "params[0] ('parameters') footprint is 1 * rows * columns in the "
                         "plan, 4 * rows * columns in Bob's signature"),
    "dropped factor": (_set("regions[1].params[0].footprint.factors", ["vocab"]),
                       "regions[1]: region 'bob-loss-gradient' differs from Bob's own: params[0] "
                       "('parameters') footprint is 4 * vocab in the plan, 4 * grid.x * vocab in "
                       "Bob's signature"),
    "read instead of write": (_set("regions[3].params[0].access", "read"),
                              "regions[3]: region 'bob-greedy-argmax' differs from Bob's own: "
                              "params[0] ('prediction') access is read in the plan, write in "
                              "Bob's signature"),
    "alignment differs": (_set("regions[0].params[1].align", 1),
                          "regions[0]: region 'bob-row-gather' differs from Bob's own: params[1] "
                          "('prompt') align is 1 in the plan, 4 in Bob's signature"),
    "scalar type differs": (_set("regions[0].params[3].dtype", "f32"),
                            "regions[0]: region 'bob-row-gather' differs from Bob's own: "
                            "params[3] ('vocab') dtype is f32 in the plan, u32 in Bob's "
                            "signature"),
    "a parameter fewer": (_delete("regions[3].params[2]"),
                          "regions[3]: region 'bob-greedy-argmax' differs from Bob's own: 2 "
                          "parameters in the plan, 3 in Bob's signature"),
    "registers differ": (_set("regions[0].registers", 40),
                         "regions[0]: region 'bob-row-gather' differs from Bob's own: registers "
                         "is 40 in the plan, 32 in Bob's signature"),
    "entry differs": (_set("regions[0].entry", "main"),
                      "regions[0]: region 'bob-row-gather' differs from Bob's own: entry is "
                      "'main' in the plan, 'bob_row_gather' in Bob's signature"),
    "shared memory past the target": (_set("regions[0].shared_bytes", 99 * 1024 + 1),
                                      "regions[0].shared_bytes: 101377 is above sm_86's 101376"),
    "foreign region": (_set("regions[1].name", "their-kernel"),
                       "regions[1].name: region 'their-kernel' is not one of Bob's "
                       f"({', '.join(sorted(SIGNATURES))}); a region's footprints, parameters "
                       "and code come from Bob's own signatures, never from the file"),
    "region declared twice": (_set("regions[1].name", "bob-row-gather"),
                              "regions[1].name: region 'bob-row-gather' is declared twice"),
    "code not hex": (_set("regions[0].code", "zz"),
                     "regions[0].code: not lower-case hexadecimal bytes"),
    "placed bytes not the code's": (_set("placed_regions[0].bytes", 7),
                                    "placed_regions[0].bytes: 7 is not the 0 bytes of region "
                                    "'bob-row-gather''s code"),
    "placed region undeclared": (_set("placed_regions[0].name", "bob-fused-train"),
                                 "placed_regions[0].name: 'bob-fused-train' is not a declared "
                                 "region"),
}


def _write(tmp_path: Path, edit, plan=PLAN) -> Path:
    if getattr(edit, "on_text", False):
        text = edit(dumps(plan))
    else:
        data = json.loads(dumps(plan))
        edit(data)
        text = json.dumps(data)
    path = tmp_path / "plan.json"
    path.write_text(text)
    return path


def _refused(tmp_path: Path, capsys, path: Path, *flags: str) -> str:
    before = {p: p.read_bytes() for p in tmp_path.iterdir()}
    status = main(["certify", "--plan", str(path), *flags])
    captured = capsys.readouterr()
    assert status == 2, captured
    assert captured.out == ""
    assert {p: p.read_bytes() for p in tmp_path.iterdir()} == before  # nothing written
    assert captured.err.count("\n") == 1 and "Traceback" not in captured.err
    return captured.err


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_bob_certify_refuses_a_malformed_plan(case, tmp_path, capsys):
    edit, message = REFUSALS[case]
    path = _write(tmp_path, edit)
    assert _refused(tmp_path, capsys, path) == f"bob: {path}: {message}\n"
    assert _refused(tmp_path, capsys, path, "--json") == f"bob: {path}: {message}\n"


def test_the_unedited_plan_is_certified_through_the_cli(tmp_path, capsys):
    path = _write(tmp_path, lambda data: None)
    assert main(["certify", "--plan", str(path)]) == 0
    assert "certified" in capsys.readouterr().out


def test_a_plan_larger_than_any_plan_is_refused_before_reading(tmp_path, capsys, monkeypatch):
    path = _write(tmp_path, lambda data: None)
    monkeypatch.setattr(jsonio, "MAX_PLAN_BYTES", path.stat().st_size - 1)
    message = _refused(tmp_path, capsys, path)
    assert message == f"bob: {path}: larger than any plan (0 MiB)\n"


@pytest.mark.parametrize("text,message", [
    ("[]", "format: not a Bob plan (expected 'bob-plan'; write one with 'bob plan --json')"),
    ("7", "format: not a Bob plan (expected 'bob-plan'; write one with 'bob plan --json')"),
    ('{"format": "bob-plan"}', "version: missing"),
    ('{"format": "bob-plan", "version": "1x"}', "version: '1x' is not an integer"),
    ('{"format": "bob-plan", "version": 1}', "target: missing"),
    ('{"format": "bob-plan", "version": 1, "target": []}', "region_alignment: missing"),
    ('{"format": "bob-plan", "version": 2}',
     "version: plan format version 2 is not supported (this Bob reads version 1)"),
])
def test_documents_that_are_not_plans(text, message, tmp_path, capsys):
    path = tmp_path / "plan.json"
    path.write_text(text)
    assert _refused(tmp_path, capsys, path) == f"bob: {path}: {message}\n"


def test_a_target_that_is_not_an_object(tmp_path, capsys):
    data = json.loads(dumps(PLAN))
    data["target"] = []
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(data))
    assert _refused(tmp_path, capsys, path) == \
        f"bob: {path}: target: expected an object, not an array\n"


def test_not_utf8_is_refused(tmp_path, capsys):
    path = tmp_path / "plan.json"
    path.write_bytes(b"\xff\xfe{}")
    assert _refused(tmp_path, capsys, path) == \
        f"bob: {path}: not a text file (a plan is JSON from 'bob plan --json')\n"


def test_the_regions_are_bobs_objects_not_the_files():
    """What a backend receives is the catalogue's region, equal field for field."""
    plan = loads(dumps(PLAN), regions=catalogue())
    for region in plan.regions:
        assert region == catalogue().declared[region.name]
        assert region.params == SIGNATURES[region.name]


def test_a_foreign_program_reads_with_its_own_catalogue():
    """The documented way to read foreign regions: the client passes its own signatures."""
    scale = Region("scale", b"", 16, 128, 0, (
        PointerParam("x", Footprint(4, ("n",)), "readwrite"), ScalarParam("n", "u32")))
    program = ProgramSpec(
        regions=(scale,), tensors=(TensorSpec("x", "f32", (1000,)),),
        launches=(LaunchSpec("scale", Dim3(8), Dim3(128), (TensorRef("x"), Scalar.u32(1000))),),
        submissions=(Submission(0, 1, 1),),
    )
    text = dumps(place(program, SM90))
    theirs = RegionCatalogue({"scale": scale}, owner="the scaler")
    assert certify(loads(text, regions=theirs)).holds
    with pytest.raises(BadInput, match="region 'scale' is not one of Bob's"):
        loads(text, regions=catalogue())
    shrunk = text.replace('"scale": 4', '"scale": 1')
    with pytest.raises(BadInput, match=r"differs from the scaler's own: params\[0\] \('x'\) "
                                       r"footprint is 1 \* n in the plan, 4 \* n"):
        loads(shrunk, regions=theirs)
    with pytest.raises(BadInput, match="carries code, and the scaler has no compiled image"):
        loads(text.replace('"code": ""', '"code": "00"'), regions=theirs)


def test_a_shrunk_footprint_would_have_hidden_an_overflow(tmp_path, capsys):
    """The issue's attack: shrink a footprint so that a real overflow passes."""
    data = json.loads(dumps(PLAN))
    adamw = data["launches"][3]
    adamw["args"][0]["pointer"] = hex(int(adamw["args"][0]["pointer"], 16) + 4096)
    path = tmp_path / "overflow.json"
    path.write_text(json.dumps(data))
    assert main(["certify", "--plan", str(path), "--json"]) == 1  # the overflow is found
    verdict = json.loads(capsys.readouterr().out)
    assert {h["kind"] for h in verdict["hazards"]} == {"footprint-overflow"}
    data["regions"][ADAMW]["params"][0]["footprint"] = {"scale": 4, "factors": []}
    path.write_text(json.dumps(data))
    assert main(["certify", "--plan", str(path)]) == 2  # and hiding it is refused
    assert "region 'bob-adamw' differs from Bob's own" in capsys.readouterr().err


def test_sm90_limits_are_its_own(tmp_path, capsys):
    plan = build_plan(BobConfig(prompts=1, updates=1), SM90)
    path = _write(tmp_path, _set("regions[0].shared_bytes", 227 * 1024 + 1), plan)
    assert _refused(tmp_path, capsys, path) == \
        f"bob: {path}: regions[0].shared_bytes: 232449 is above sm_90's 232448\n"
    path = _write(tmp_path, _set("target.parameter_base", "0x160"), plan)
    assert _refused(tmp_path, capsys, path) == \
        f"bob: {path}: target.parameter_base: 0x160 is not sm_90's 0x210\n"


# -- the certificate holds plans built in Python to the same limits -------------------


def _generic(block: Dim3, grid: Dim3 | None = None, registers: int = 32, shared: int = 0,
             target=SM86):
    grid = grid or Dim3(1)
    region = Region("k", b"", registers, block.x, shared,
                    (PointerParam("x", Footprint(4)), ScalarParam("n", "u32")))
    program = ProgramSpec(
        regions=(region,), tensors=(TensorSpec("x", "f32", (4,)),),
        launches=(LaunchSpec("k", grid, block, (TensorRef("x"), Scalar.u32(1))),),
        submissions=(Submission(0, 1, 1),),
    )
    return place(program, target)


@pytest.mark.parametrize("block,grid,registers,shared,message", [
    (Dim3(2048), Dim3(1), 32, 0, "launch 0 (k): block.x = 2048, sm_86 allows 1024"),
    (Dim3(32, 2048), Dim3(1), 32, 0, "launch 0 (k): block.y = 2048, sm_86 allows 1024"),
    (Dim3(1, 1, 65), Dim3(1), 32, 0, "launch 0 (k): block.z = 65, sm_86 allows 64"),
    (Dim3(512, 4), Dim3(1), 32, 0, "launch 0 (k): 2048 threads per block, sm_86 allows 1024"),
    (Dim3(32), Dim3(2**31), 32, 0, "launch 0 (k): grid.x = 2147483648, sm_86 allows 2147483647"),
    (Dim3(32), Dim3(1, 1, 65536), 32, 0, "launch 0 (k): grid.z = 65536, sm_86 allows 65535"),
    (Dim3(32), Dim3(1), 256, 0, "region 'k' uses 256 registers per thread, sm_86 allows 255"),
    (Dim3(32), Dim3(1), 32, 99 * 1024 + 4,
     "region 'k' uses 101380 bytes of shared memory, sm_86 allows 101376 per block"),
    # 1024 threads of 65 registers: 72 per thread once rounded to 8, 73728 > 65536.
    (Dim3(1024), Dim3(1), 65, 0,
     "launch 0 (k): 1024 threads of region 'k' need 73728 registers, sm_86 has 65536 per block"),
])
def test_the_certificate_checks_the_hardware_limits(block, grid, registers, shared, message):
    certificate = certify(_generic(block, grid, registers, shared))
    assert certificate.kinds() == {"hardware-limit"}
    assert f"hardware-limit: {message}" in [str(h) for h in certificate.hazards]


def test_the_hardware_limits_hold_at_the_limit():
    assert certify(_generic(Dim3(1024), Dim3(2**31 - 1, 65535, 65535), 64)).holds
    assert certify(_generic(Dim3(1, 1, 64), registers=255, shared=99 * 1024)).holds
    assert not certify(_generic(Dim3(32), shared=227 * 1024)).holds
    assert certify(_generic(Dim3(32), shared=227 * 1024, target=SM90)).holds


def test_targets_state_their_limits():
    assert (SM86.max_block, SM86.max_grid) == ((1024, 1024, 64), (2**31 - 1, 65535, 65535))
    assert SM86.max_threads_per_block == SM90.max_threads_per_block == 1024
    assert (SM86.max_shared_bytes_per_block, SM90.max_shared_bytes_per_block) == \
        (101376, 232448)
    assert replace(SM86, max_threads_per_block=512) != SM86


def test_a_compiled_plan_is_checked_against_bobs_image(tmp_path, capsys):
    """Code, registers and shared memory come from Bob's image, checked by digest."""
    pytest.importorskip("cuda.bindings.nvrtc")
    assert main(["plan", "--json", "-P", "1", "-N", "1", "--arch", "sm_86"]) == 0
    text = capsys.readouterr().out
    path = tmp_path / "compiled.json"
    path.write_text(text)
    assert main(["certify", "--plan", str(path)]) == 0
    capsys.readouterr()
    data = json.loads(text)
    code = bytes.fromhex(data["regions"][0]["code"])
    assert code and certify(loads(text, regions=catalogue())).holds
    data["regions"][0]["code"] = (code[:-1] + bytes([code[-1] ^ 1])).hex()
    path.write_text(json.dumps(data))
    err = _refused(tmp_path, capsys, path)
    assert err.startswith(f"bob: {path}: regions[0]: region 'bob-row-gather' differs from "
                          "Bob's own: code sha256 ")
    assert err.endswith(" in Bob's sm_86 image\n")
    data = json.loads(text)
    data["regions"][1]["registers"] += 1
    path.write_text(json.dumps(data))
    registers = json.loads(text)["regions"][1]["registers"]
    assert _refused(tmp_path, capsys, path) == (
        f"bob: {path}: regions[1]: region 'bob-loss-gradient' differs from Bob's own: "
        f"registers is {registers + 1} in the plan, {registers} in Bob's sm_86 image\n")


def test_a_zero_alignment_in_a_python_plan_is_a_hazard_not_a_crash():
    plan = _generic(Dim3(32))
    assert certify(replace(plan, region_alignment=0)).kinds() == {"misaligned"}
    region = plan.regions[0]
    unaligned = replace(region, params=(replace(region.params[0], align=0), region.params[1]))
    assert certify(replace(plan, regions=(unaligned,))).kinds() == {"misaligned"}
