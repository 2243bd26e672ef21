"""Fuzzing the plan reader and the certificate: 5,000 mutated plans a run.

Each example takes one of Bob's own plans as JSON, mutates it (nudged and
replaced values, copied pointers, deleted and added keys, dropped, repeated
and swapped list items, and edits of the text itself), and reads and certifies
it. Nothing may raise but BadInput from the reader; a plan the certificate
accepts is checked again by `violations` below, written without the
certificate: every byte each launch can reach through each pointer lies inside
one tensor, the tensors are disjoint and inside the arena, launches are within
the hardware's limits, and every region is Bob's own.
"""

from __future__ import annotations

import copy
import json
import math
from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bob.cli.main import main
from bob.errors import BadInput
from bob.kernels.cuda.regions import catalogue
from bob.kernels.signatures import SIGNATURES
from bob.plan import SM86, SM90, certify
from bob.plan.jsonio import dumps, loads
from bob.plan.model import Address, Plan, PointerParam, Scalar
from bob.program.bob import BobConfig, build_plan

EXAMPLES = 5000
BASES = tuple(dumps(build_plan(config, target)) for config, target in (
    (BobConfig(vocab=256, prompts=1, updates=1), SM86),
    (BobConfig(vocab=2, prompts=2, updates=2, mode="corpus", pairs=3), SM90),
    (BobConfig(vocab=16, prompts=1, updates=3, schedule="fused"), SM86),
    # with validation: both scatters and the loss alone
    (BobConfig(vocab=4, prompts=0, updates=1, mode="corpus", schedule="fused", pairs=16,
               validation_pairs=5), SM90),
))
CATALOGUE = catalogue()

# -- the independent checker -------------------------------------------------------
# Limits of compute capability 8.6 and 9.0, written here rather than read from the
# Target, so that a wrong limit there is caught.
MAX_BLOCK = (1024, 1024, 64)
MAX_GRID = (2**31 - 1, 65535, 65535)
MAX_THREADS = 1024


def violations(plan: Plan) -> list[str]:
    """Everything unsafe about `plan`, found without the certificate."""
    found = []
    arena_start = plan.address_map.arena.base
    arena_end = arena_start + plan.address_map.arena.bytes
    spans = sorted((t.address, t.address + t.bytes, t.name) for t in plan.tensors)
    furthest = None
    for start, end, name in spans:
        if start < arena_start or end > arena_end:
            found.append(f"tensor {name} lies outside the arena")
        if furthest is not None and start < furthest[0]:
            found.append(f"tensor {name} overlaps {furthest[1]}")
        if furthest is None or end > furthest[0]:
            furthest = (end, name)
    for region in plan.regions:
        if region.params != SIGNATURES.get(region.name) or region.code:
            found.append(f"region {region.name} is not Bob's")
    for index, launch in enumerate(plan.launches):
        found += _launch_violations(plan, index, launch, spans)
    return found


def _launch_violations(plan: Plan, index: int, launch, spans) -> list[str]:
    found = []
    grid, block = launch.grid, launch.block
    for value, limit in zip((grid.x, grid.y, grid.z, block.x, block.y, block.z),
                            MAX_GRID + MAX_BLOCK, strict=True):
        if not 1 <= value <= limit:
            found.append(f"launch {index}: dimension {value} outside [1, {limit}]")
    if block.x * block.y * block.z > MAX_THREADS:
        found.append(f"launch {index}: too many threads")
    signature = SIGNATURES.get(launch.region)
    if signature is None or len(signature) != len(launch.args):
        return [*found, f"launch {index}: arguments do not fit region {launch.region}"]
    values = {"grid.x": grid.x, "grid.y": grid.y, "grid.z": grid.z,
              "block.x": block.x, "block.y": block.y, "block.z": block.z}
    for param, arg in zip(signature, launch.args, strict=True):
        if isinstance(arg, Scalar) and arg.dtype == "u32":
            values[param.name] = arg.bits
    for param, arg in zip(signature, launch.args, strict=True):
        if not isinstance(param, PointerParam):
            continue
        if not isinstance(arg, Address):
            found.append(f"launch {index}: {param.name} is not a pointer")
            continue
        reach = param.footprint.scale * math.prod(values[f] for f in param.footprint.factors)
        first, last = arg.address, arg.address + reach
        if reach and not any(start <= first and last <= end for start, end, _ in spans):
            found.append(f"launch {index}: {param.name} reaches [{first:#x}, {last:#x}), "
                         "which no one tensor holds")
    return found


# -- mutations -----------------------------------------------------------------------

POOL = (-1, 0, 1, 3, 4, 255, 256, 1024, 1025, 65535, 65536, 2**31, 2**32, 2**63, 2**64,
        2**70, -2**70, 1.5, None, True, "", "0x", "0x10", "-0x4", "abc", [], {}, [1, 2, 3],
        "x" * 300)
DELTAS = (-4096, -1024, -256, -16, -4, -2, -1, 1, 2, 4, 16, 256, 1024, 4096, 2**32)


def _places(node, path=()):
    """Every (path, value) in the document, containers included."""
    yield path, node
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _places(value, (*path, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _places(value, (*path, index))


def _integer_of(value):
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.startswith("0x"):
        try:
            return int(value, 16)
        except ValueError:
            return None
    return None


def _put(doc, path, value):
    for step in path[:-1]:
        doc = doc[step]
    doc[path[-1]] = value


# The fields the certificate judges: most mutations land here, so that many mutants
# are well formed and reach the certificate (the rest test the reader).
JUDGED = ("pointer", "u32", "address", "base", "bytes", "first_launch", "count", "semaphore",
          "code_extent", "forward_submissions", "grid", "block")


def _mutate(doc, data) -> None:
    places = list(_places(doc))[1:]
    judged = data.draw(st.integers(0, 3)) > 0
    if judged:
        places = [(p, v) for p, v in places if _integer_of(v) is not None
                  and (p[-1] in JUDGED or (len(p) > 1 and p[-2] in JUDGED))]
    path, value = data.draw(st.sampled_from(places))
    parent = doc
    for step in path[:-1]:
        parent = parent[step]
    hows = ("nudge", "nudge", "copy") if judged else (
        "nudge", "replace", "copy", "delete", "add", "list")
    how = data.draw(st.sampled_from(hows))
    number = _integer_of(value)
    if how == "nudge" and number is not None:
        changed = number + data.draw(st.sampled_from(DELTAS))
        _put(doc, path, hex(changed) if isinstance(value, str) and changed >= 0 else changed)
    elif how == "copy":
        # Another value of the same kind: realistic aliasing (a pointer to another tensor).
        same = [v for p, v in places if type(v) is type(value) and p != path]
        if same:
            _put(doc, path, copy.deepcopy(data.draw(st.sampled_from(same))))
    elif how == "delete" and isinstance(parent, dict):
        del parent[path[-1]]
    elif how == "add" and isinstance(value, dict):
        value[data.draw(st.sampled_from(("zz", "value", "u32", "label", "bytes")))] = 1
    elif how == "list" and isinstance(value, list) and value:
        i = data.draw(st.integers(0, len(value) - 1))
        j = data.draw(st.integers(0, len(value) - 1))
        edit = data.draw(st.sampled_from(("drop", "repeat", "swap")))
        if edit == "drop":
            del value[i]
        elif edit == "repeat":
            value.insert(j, copy.deepcopy(value[i]))
        else:
            value[i], value[j] = value[j], value[i]
    else:
        _put(doc, path, copy.deepcopy(data.draw(st.sampled_from(POOL))))


def _mutate_text(text: str, data) -> str:
    how = data.draw(st.sampled_from(("truncate", "digits", "nest", "repeat-key")))
    if how == "truncate":
        return text[:data.draw(st.integers(0, len(text) - 1))]
    if how == "digits":
        return text.replace('"code_extent": ', '"code_extent": ' + "7" * 5000, 1)
    if how == "nest":
        depth = data.draw(st.integers(1, 50_000))
        return text.replace('"figures": ', '"figures": ' + "[" * depth + "]" * depth + ", "
                            '"figures2": ', 1)
    return text.replace('"page_bytes": ', '"page_bytes": 4096, "page_bytes": ', 1)


def _mutant(data) -> str:
    doc = json.loads(BASES[data.draw(st.integers(0, len(BASES) - 1))])
    for _ in range(data.draw(st.integers(1, 3))):
        _mutate(doc, data)
    text = json.dumps(doc)
    if data.draw(st.integers(0, 19)) == 0:
        text = _mutate_text(text, data)
    return text


# -- the properties -----------------------------------------------------------------

def test_the_checker_finds_what_it_should():
    """The independent checker is not vacuous: Bob's plans pass, a planted overflow fails."""
    for text in BASES:
        assert violations(loads(text, regions=CATALOGUE)) == []
    doc = json.loads(BASES[0])
    pointer = doc["launches"][3]["args"][0]
    pointer["pointer"] = hex(int(pointer["pointer"], 16) + 4)
    assert violations(loads(json.dumps(doc), regions=CATALOGUE)) == [
        "launch 3: parameters reaches [0x2000800004, 0x2000840004), which no one tensor holds"]
    doc["tensors"][1]["address"] = doc["tensors"][0]["address"]
    assert "tensor parameters overlaps first_moment" in " ".join(
        violations(loads(json.dumps(doc), regions=CATALOGUE))) or "tensor first_moment " \
        "overlaps parameters" in " ".join(violations(loads(json.dumps(doc), regions=CATALOGUE)))


def test_mutated_plans_are_refused_or_safe():
    outcomes: Counter[str] = Counter()

    @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=False,
              suppress_health_check=list(HealthCheck))
    @given(st.data())
    def one_plan(data):
        text = _mutant(data)
        try:
            plan = loads(text, "<mutant>", regions=CATALOGUE)
        except BadInput as refusal:
            assert "\n" not in str(refusal)
            outcomes["refused on reading"] += 1
            return
        certificate = certify(plan)
        if not certificate.holds:
            outcomes["refused by the certificate"] += 1
            return
        outcomes["certified"] += 1
        assert violations(plan) == []

    one_plan()
    print(dict(outcomes))
    assert sum(outcomes.values()) >= EXAMPLES
    # Each way through is taken often enough for the run to mean something.
    for outcome in ("refused on reading", "refused by the certificate", "certified"):
        assert outcomes[outcome] >= EXAMPLES // 50, dict(outcomes)


def test_mutated_plans_through_the_cli_never_end_in_a_traceback(tmp_path, capsys):
    path = tmp_path / "plan.json"

    @settings(max_examples=200, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(st.data())
    def one_plan(data):
        path.write_text(_mutant(data))
        status = main(["certify", "--plan", str(path), "--json"])
        captured = capsys.readouterr()
        assert status in (0, 1, 2)
        if status == 2:
            assert captured.out == "" and captured.err.startswith(f"bob: {path}: ")
            assert captured.err.count("\n") == 1
        else:
            assert json.loads(captured.out)["certified"] is (status == 0)

    one_plan()
