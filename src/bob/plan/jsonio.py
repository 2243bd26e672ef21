"""The plan as JSON: a documented, versioned schema that round-trips exactly.

Addresses are written as hex strings, binary32 scalars by their bit pattern
(with the decimal value beside it for readers), machine code as hex. The
schema is described in docs/PLAN-FORMAT.md. ``figures`` is written for
readers and ignored on reading: the figures follow from the plan.

Reading trusts nothing in the file: every field is checked (type, range,
alignment, the target's hardware limits), and each region is taken from the
caller's ``RegionCatalogue`` (for ``bob certify --plan``, Bob's own
signatures and compiled image), the file's copy refused where it differs.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from bob.config import DEFAULT_SUBMISSION_POLICY, SUBMISSION_POLICIES
from bob.errors import BadInput
from bob.plan.model import (
    DTYPE_BYTES,
    Address,
    AddressMap,
    Component,
    Dim3,
    Footprint,
    Launch,
    Param,
    PlacedRegion,
    Plan,
    PointerParam,
    Region,
    RegionCatalogue,
    Scalar,
    ScalarParam,
    Submission,
    Target,
    Tensor,
)
from bob.plan.placement import SEMAPHORE_STRIDE, TARGETS

FORMAT = "bob-plan"
VERSION = 1


def _hex(value: int) -> str:
    return f"0x{value:x}"


def _param_json(param: Param) -> dict[str, Any]:
    if isinstance(param, PointerParam):
        return {
            "kind": "pointer", "name": param.name, "access": param.access, "align": param.align,
            "footprint": {"scale": param.footprint.scale, "factors": list(param.footprint.factors)},
        }
    return {"kind": "scalar", "name": param.name, "dtype": param.dtype}


def _arg_json(arg: Address | Scalar) -> dict[str, Any]:
    if isinstance(arg, Address):
        return {"pointer": _hex(arg.address)}
    if arg.dtype == "f32":
        return {"f32": f"0x{arg.bits:08x}", "value": arg.value}
    return {"u32": arg.bits}


def _launch_json(launch: Launch) -> dict[str, Any]:
    """A launch; its cluster only where it has one (a plan without clusters reads as before)."""
    out = {"region": launch.region, "label": launch.label,
           "grid": [launch.grid.x, launch.grid.y, launch.grid.z],
           "block": [launch.block.x, launch.block.y, launch.block.z],
           "args": [_arg_json(a) for a in launch.args]}
    if launch.cluster != 1:
        out["cluster"] = launch.cluster
    return out


def plan_to_json(plan: Plan) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "version": VERSION,
        "target": {
            "name": plan.target.name,
            "parameter_base": _hex(plan.target.parameter_base),
            "parameter_block_bytes": plan.target.parameter_block_bytes,
            "qmd_record_bytes": plan.target.qmd_record_bytes,
            "qmd_stride_bytes": plan.target.qmd_stride_bytes,
            "pushbuffer_setup_bytes": plan.target.pushbuffer_setup_bytes,
            "pushbuffer_bytes_per_submission": plan.target.pushbuffer_bytes_per_submission,
        },
        "region_alignment": plan.region_alignment,
        "page_bytes": plan.page_bytes,
        "address_map": {
            c.name: {"base": _hex(c.base), "bytes": c.bytes} for c in plan.address_map.components
        },
        "regions": [
            {
                "name": r.name, "entry": r.entry, "registers": r.registers, "block_x": r.block_x,
                "shared_bytes": r.shared_bytes, "dynamic_shared_bytes": r.dynamic_shared_bytes,
                "params": [_param_json(p) for p in r.params],
                "code": r.code.hex(),
            }
            for r in plan.regions
        ],
        "placed_regions": [
            {"name": p.name, "address": _hex(p.address), "bytes": p.bytes}
            for p in plan.placed_regions
        ],
        "code_extent": plan.code_extent,
        "tensors": [
            {"name": t.name, "dtype": t.dtype, "shape": list(t.shape), "address": _hex(t.address),
             "bytes": t.bytes, "align": t.align}
            for t in plan.tensors
        ],
        "launches": [_launch_json(launch) for launch in plan.launches],
        "submissions": [
            {"first_launch": s.first_launch, "count": s.count, "semaphore": s.semaphore}
            for s in plan.submissions
        ],
        "forward_launches": plan.forward_launches,
        "forward_submissions": plan.forward_submissions,
        "submission_policy": plan.submission_policy,
        "attributes": dict(plan.attributes),  # a copy: editing the JSON leaves the plan
        "figures": {
            "launches": plan.launch_count,
            "submissions": plan.submission_count,
            "program_bytes": plan.program_bytes,
            "qmd_table_bytes": plan.qmd_table_bytes,
            "arena_bytes": plan.arena_bytes,
            "code_extent": plan.code_extent,
        },
    }


def dumps(plan: Plan) -> str:
    return json.dumps(plan_to_json(plan), indent=1)


# -- reading: nothing in the file is trusted -------------------------------------
#
# Every field is checked for type and range before anything is built from it;
# a region's footprints, parameters and code come from the program's own
# catalogue (the file's copy must agree); the target's facts come from Bob's
# own Target of that name. The certificate then judges the plan.

# Bob's largest plan (V = 256, P = 4096, N = 100 000, seed schedule) is 158 MiB.
MAX_PLAN_BYTES = 256 << 20
# regions[].params[].footprint.factors is the deepest a plan nests: 7 levels.
MAX_DEPTH = 8
U64_MAX = (1 << 64) - 1
U32_MAX = (1 << 32) - 1
# The longest integer below 2**64: "0x" and 16 hex digits, or 20 decimal digits.
MAX_INTEGER_CHARS = 20
MAX_NAME_CHARS = 256
MAX_TEXT_CHARS = 4096
MAX_SHAPE_DIMS = 8
MAX_FACTORS = 8
# How many of each a plan may list, checked before any is read. Bob's plans hold at most
# 15 tensors and 7 regions; its largest (P = 4096, N = 100 000) 208 194 launches and
# 216 386 submissions.
MAX_TENSORS = 4096
MAX_REGIONS = 256
MAX_LAUNCHES = 1 << 22
MAX_SUBMISSIONS = 1 << 22
# A parameter block is constant bank 0 of its launch, which holds 64 KiB.
MAX_PARAMETER_BLOCK_BYTES = 64 << 10
MAX_QMD_STRIDE_BYTES = 64 << 10
MAX_PUSHBUFFER_SETUP_BYTES = 1 << 20
MAX_PUSHBUFFER_SUBMISSION_BYTES = 64 << 10
# Components start at 2 MiB boundaries: no alignment inside one can usefully exceed that.
MAX_LAYOUT_ALIGNMENT = 2 << 20
# Loads are at most 16 bytes wide; a pointer needs no more than a page.
MAX_POINTER_ALIGNMENT = 4096
PUSHBUFFER_WORD_BYTES = 4
# QMD records are dispatched by address >> 8 (SEND_PCAS_A_QMD_ADDRESS_SHIFTED8).
QMD_UNIT_BYTES = 256
# A parameter block is a constant buffer, sized in 16-byte units (..._SIZE_SHIFTED4).
PARAMETER_BLOCK_UNIT_BYTES = 16

_TOP_KEYS = ("format", "version", "target", "region_alignment", "page_bytes", "address_map",
             "regions", "placed_regions", "code_extent", "tensors", "launches", "submissions",
             "forward_launches", "forward_submissions")
_TARGET_KEYS = ("name", "parameter_base", "parameter_block_bytes", "qmd_record_bytes",
                "qmd_stride_bytes", "pushbuffer_setup_bytes", "pushbuffer_bytes_per_submission")
# Facts of the architecture: a plan must state Bob's own values for its target.
_TARGET_FACTS = ("parameter_base", "qmd_record_bytes")
_COMPONENT_NAMES = ("program", "qmd-table", "pushbuffer", "semaphores", "arena")
_REGION_KEYS = ("name", "entry", "registers", "block_x", "shared_bytes", "params", "code")
_FIGURE_KEYS = ("launches", "submissions", "program_bytes", "qmd_table_bytes", "arena_bytes",
                "code_extent")
_INTEGER = re.compile(r"-?(?:0[xX](?P<hex>[0-9a-fA-F]+)|(?P<dec>[0-9]+))")
_HEX_BYTES = re.compile(r"(?:[0-9a-f]{2})*")
# A JSON string, escapes included (the unrolled form: no backtracking per character).
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_BRACKET = re.compile(r"[\[\]{}]")


class _LongNumber:
    """A JSON integer too long to lie below 2**64: kept by its length, refused where read."""

    def __init__(self, digits: str):
        self.digits = len(digits.lstrip("-"))


class _Repeated(dict):
    """An object in which a key appears twice (JSON keeps the last; a plan may not)."""

    key: str = ""


def _parse_int(digits: str) -> int | _LongNumber:
    # Python refuses to convert more than 4300 digits (and it is slow well before):
    # anything longer than 2**64 needs is kept aside, never converted.
    return _LongNumber(digits) if len(digits) > MAX_INTEGER_CHARS + 1 else int(digits)


def _object(pairs: list[tuple[str, Any]]) -> dict:
    obj = dict(pairs)
    if len(obj) == len(pairs):
        return obj
    seen: set[str] = set()
    repeated = _Repeated(obj)
    repeated.key = next(key for key, _ in pairs if key in seen or seen.add(key))
    return repeated


def _nests_deeper_than(text: str, limit: int) -> bool:
    """Whether arrays and objects nest more than `limit` deep, strings aside."""
    depth = 0
    for bracket in _BRACKET.finditer(_STRING.sub('""', text)):
        depth += 1 if bracket.group() in "[{" else -1
        if depth > limit:
            return True
    return False


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, _LongNumber):
        return f"a {value.digits}-digit number"
    names = {dict: "an object", list: "an array", str: "a string", int: "an integer",
             float: "a number"}
    return next(name for kind, name in names.items() if isinstance(value, kind))


def _show(text: str) -> str:
    """A string from the file, quoted and cut short enough for a one-line message."""
    return repr(text) if len(text) <= 40 else repr(text[:37]) + "..."


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


class _Reader:
    """Reads fields, each checked; errors are one line naming the file and the JSON path."""

    def __init__(self, source: str, catalogue: RegionCatalogue):
        self.source = source
        self.catalogue = catalogue
        self._compiled: Mapping[str, Region] | None = None

    def fail(self, path: str, problem: str) -> BadInput:
        return BadInput(f"{self.source}: {path or 'plan'}: {problem}")

    def fields(self, value: Any, path: str, required: tuple[str, ...],
               optional: tuple[str, ...] = ()) -> dict[str, Any]:
        """An object with every required key, perhaps some optional ones, and no other."""
        value = self.object(value, path)
        for key in value:
            if key not in required and key not in optional:
                raise self.fail(path, f"unknown key {_show(key)}")
        for key in required:
            if key not in value:
                raise self.fail(_join(path, key), "missing")
        return value

    def object(self, value: Any, path: str) -> dict[str, Any]:
        """A JSON object in which no key appears twice."""
        if not isinstance(value, dict):
            raise self.fail(path, f"expected an object, not {_kind(value)}")
        if isinstance(value, _Repeated):
            raise self.fail(path, f"key {_show(value.key)} appears twice")
        return value

    def integer(self, value: Any, path: str, low: int = 0, high: int = U64_MAX,
                limit: str = "") -> int:
        """An integer in [low, high]; `limit` says whose limit `high` is."""
        number = self._integer(value, path)
        if number < low:
            raise self.fail(path, f"{number} is below {low}")
        if number > high:
            if high == U64_MAX:
                raise self.fail(path, f"{number} is not below 2**64")
            raise self.fail(path, f"{number} is above {limit or high}")
        return number

    def _integer(self, value: Any, path: str) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, _LongNumber):
            raise self.fail(path, f"a {value.digits}-digit integer is not below 2**64")
        if not isinstance(value, str):
            raise self.fail(path, f"expected an integer, not {_kind(value)}")
        if len(value) > MAX_INTEGER_CHARS + 1:
            raise self.fail(path, f"a {len(value)}-character string is not an integer "
                            "below 2**64")
        match = _INTEGER.fullmatch(value)
        if match is None:
            raise self.fail(path, f"{_show(value)} is not an integer")
        magnitude = int(match["hex"], 16) if match["hex"] else int(match["dec"])
        return -magnitude if value.startswith("-") else magnitude

    def multiple(self, value: Any, path: str, unit: int, low: int, high: int) -> int:
        number = self.integer(value, path, low, high)
        if number % unit:
            raise self.fail(path, f"{number} is not a multiple of {unit}")
        return number

    def power_of_two(self, value: Any, path: str, high: int = 1 << 63) -> int:
        number = self.integer(value, path, 0, U64_MAX)
        if number < 1 or number & (number - 1) or number > high:
            raise self.fail(path, f"{number} is not a power of two from 1 to {high}")
        return number

    def string(self, value: Any, path: str, max_chars: int = MAX_NAME_CHARS) -> str:
        if not isinstance(value, str):
            raise self.fail(path, f"expected a string, not {_kind(value)}")
        if len(value) > max_chars:
            raise self.fail(path, f"a {len(value)}-character string is longer than "
                            f"{max_chars}")
        return value

    def name(self, value: Any, path: str) -> str:
        text = self.string(value, path)
        if not text:
            raise self.fail(path, "empty name")
        return text

    def choice(self, value: Any, path: str, options: tuple[str, ...]) -> str:
        text = self.string(value, path)
        if text not in options:
            raise self.fail(path, f"{_show(text)} is not one of {', '.join(options)}")
        return text

    def array(self, value: Any, path: str, max_items: int | None = None) -> list:
        if not isinstance(value, list):
            raise self.fail(path, f"expected an array, not {_kind(value)}")
        if max_items is not None and len(value) > max_items:
            raise self.fail(path, f"{len(value)} items, at most {max_items}")
        return value

    def end(self, start: int, size: int, path: str) -> int:
        """start + size, refused where it runs past the 64-bit address space."""
        if start + size > U64_MAX + 1:
            raise self.fail(path, f"[0x{start:x}, +{size}) ends past 2**64")
        return start + size

    def compiled(self, target: Target) -> Mapping[str, Region]:
        if self._compiled is None:
            if self.catalogue.compiled is None:
                self._compiled = {}
            else:
                self._compiled = self.catalogue.compiled(target)
        return self._compiled


def plan_from_json(data: Any, source: str = "<plan>", *, regions: RegionCatalogue) -> Plan:
    """The plan in `data`, every field checked; its regions come from `regions`.

    Raises BadInput naming the JSON path of the first field that is malformed,
    out of range, or (for a region) differs from the catalogue's.
    """
    r = _Reader(source, regions)
    top = _header(r, data)
    target = _target(r, top["target"])
    region_alignment = r.power_of_two(top["region_alignment"], "region_alignment",
                                      MAX_LAYOUT_ALIGNMENT)
    page_bytes = r.power_of_two(top["page_bytes"], "page_bytes", MAX_LAYOUT_ALIGNMENT)
    address_map = _address_map(r, top["address_map"])
    declared = _regions(r, top["regions"], target)
    placed = _placed_regions(r, top["placed_regions"], declared)
    tensors = _tensors(r, top["tensors"])
    launches = tuple(_launch(r, item, f"launches[{i}]", target) for i, item in
                     enumerate(r.array(top["launches"], "launches", MAX_LAUNCHES)))
    submissions = tuple(_submission(r, item, f"submissions[{i}]") for i, item in
                        enumerate(r.array(top["submissions"], "submissions", MAX_SUBMISSIONS)))
    # Absent in plans written before the policy existed: they are per-launch.
    policy = r.choice(top.get("submission_policy", DEFAULT_SUBMISSION_POLICY),
                      "submission_policy", SUBMISSION_POLICIES)
    attributes = _attributes(r, top.get("attributes", {}))
    _figures(r, top.get("figures", {}))
    plan = Plan(
        target=target,
        address_map=address_map,
        region_alignment=region_alignment,
        page_bytes=page_bytes,
        regions=declared,
        placed_regions=placed,
        code_extent=r.integer(top["code_extent"], "code_extent"),
        tensors=tensors,
        launches=launches,
        submissions=submissions,
        forward_launches=r.integer(top["forward_launches"], "forward_launches",
                                   high=len(launches), limit=f"the {len(launches)} launches"),
        forward_submissions=r.integer(top["forward_submissions"], "forward_submissions",
                                      high=len(submissions),
                                      limit=f"the {len(submissions)} submissions"),
        submission_policy=policy,  # type: ignore[arg-type]
        attributes=attributes,
    )
    _check_component_sizes(r, plan)
    return plan


def _header(r: _Reader, data: Any) -> dict[str, Any]:
    """The top-level object, once it says it is a Bob plan of this version."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise r.fail("format", f"not a Bob plan (expected {FORMAT!r}; write one with "
                     "'bob plan --json')")
    if "version" not in data:
        raise r.fail("version", "missing")
    version = r.integer(data["version"], "version")
    if version != VERSION:
        raise r.fail("version", f"plan format version {version} is not supported "
                     f"(this Bob reads version {VERSION})")
    return r.fields(data, "", _TOP_KEYS, ("submission_policy", "attributes", "figures"))


def _target(r: _Reader, value: Any) -> Target:
    """Bob's own target of the plan's name, with the plan's layout choices checked."""
    t = r.fields(value, "target", _TARGET_KEYS)
    name = r.string(t["name"], "target.name")
    if name not in TARGETS:
        raise r.fail("target.name", f"unknown target {_show(name)} (Bob knows "
                     f"{', '.join(sorted(TARGETS))})")
    known = TARGETS[name]
    for key in _TARGET_FACTS:
        stated = r.integer(t[key], f"target.{key}")
        if stated != getattr(known, key):
            raise r.fail(f"target.{key}", f"0x{stated:x} is not {name}'s "
                         f"0x{getattr(known, key):x}")
    return replace(
        known,
        parameter_block_bytes=r.multiple(
            t["parameter_block_bytes"], "target.parameter_block_bytes",
            PARAMETER_BLOCK_UNIT_BYTES, PARAMETER_BLOCK_UNIT_BYTES, MAX_PARAMETER_BLOCK_BYTES),
        qmd_stride_bytes=r.multiple(
            t["qmd_stride_bytes"], "target.qmd_stride_bytes", QMD_UNIT_BYTES,
            known.qmd_record_bytes, MAX_QMD_STRIDE_BYTES),
        pushbuffer_setup_bytes=r.multiple(
            t["pushbuffer_setup_bytes"], "target.pushbuffer_setup_bytes",
            PUSHBUFFER_WORD_BYTES, PUSHBUFFER_WORD_BYTES, MAX_PUSHBUFFER_SETUP_BYTES),
        pushbuffer_bytes_per_submission=r.multiple(
            t["pushbuffer_bytes_per_submission"], "target.pushbuffer_bytes_per_submission",
            PUSHBUFFER_WORD_BYTES, PUSHBUFFER_WORD_BYTES, MAX_PUSHBUFFER_SUBMISSION_BYTES),
    )


def _address_map(r: _Reader, value: Any) -> AddressMap:
    """Five components, in order, none overlapping the one before."""
    amap = r.fields(value, "address_map", _COMPONENT_NAMES)
    components = []
    previous_end = 0
    for name in _COMPONENT_NAMES:
        path = f"address_map.{name}"
        c = r.fields(amap[name], path, ("base", "bytes"))
        base = r.integer(c["base"], f"{path}.base")
        size = r.integer(c["bytes"], f"{path}.bytes")
        end = r.end(base, size, path)
        if base < previous_end:
            raise r.fail(f"{path}.base", f"0x{base:x} is inside the component before it, "
                         f"which ends at 0x{previous_end:x}")
        components.append(Component(name, base, size))
        previous_end = end
    return AddressMap(*components)


def _regions(r: _Reader, value: Any, target: Target) -> tuple[Region, ...]:
    regions: list[Region] = []
    names: set[str] = set()
    for i, item in enumerate(r.array(value, "regions", MAX_REGIONS)):
        path = f"regions[{i}]"
        fields = r.fields(item, path, _REGION_KEYS, ("dynamic_shared_bytes",))
        name = r.name(fields["name"], f"{path}.name")
        if name in names:
            raise r.fail(f"{path}.name", f"region {_show(name)} is declared twice")
        names.add(name)
        regions.append(_trusted_region(r, fields, path, name, target))
    return tuple(regions)


def _trusted_region(r: _Reader, fields: dict[str, Any], path: str, name: str,
                    target: Target) -> Region:
    """The catalogue's region of this name, once the file's copy agrees with it."""
    code = _code(r, fields["code"], f"{path}.code")
    trusted = _catalogue_region(r, path, name, bool(code), target)
    stated = _stated_region(r, fields, path, target)
    # A region with code is compared with the compiled image, one without with the signature.
    owner = r.catalogue.owner
    origin = f"{owner}'s {target.name} image" if code else f"{owner}'s signature"
    difference = _region_difference(stated, code, trusted, origin)
    if difference is not None:
        raise r.fail(path, f"region {_show(name)} differs from {owner}'s own: {difference}")
    return trusted


def _catalogue_region(r: _Reader, path: str, name: str, with_code: bool,
                      target: Target) -> Region:
    owner = r.catalogue.owner
    if name not in r.catalogue.declared:
        known = ", ".join(sorted(r.catalogue.declared))
        raise r.fail(f"{path}.name", f"region {_show(name)} is not one of {owner}'s "
                     f"({known}); a region's footprints, parameters and code come from "
                     f"{owner}'s own signatures, never from the file")
    if not with_code:
        return r.catalogue.declared[name]
    compiled = r.compiled(target).get(name)
    if compiled is None:
        raise r.fail(f"{path}.code", f"region {_show(name)} carries code, and {owner} has "
                     f"no compiled image of it for {target.name} to check it against")
    return compiled


def _stated_region(r: _Reader, fields: dict[str, Any], path: str,
                   target: Target) -> dict[str, Any]:
    """What the file says of a region besides its name and code, each field checked."""
    return {
        "params": _params(r, fields["params"], f"{path}.params"),
        "entry": r.string(fields["entry"], f"{path}.entry"),
        "registers": r.integer(fields["registers"], f"{path}.registers",
                               high=target.max_registers_per_thread,
                               limit=f"{target.name}'s {target.max_registers_per_thread}"),
        "block_x": r.integer(fields["block_x"], f"{path}.block_x", 1, target.max_block[0],
                             f"{target.name}'s {target.max_block[0]}"),
        "shared_bytes": r.integer(fields["shared_bytes"], f"{path}.shared_bytes",
                                  high=target.max_shared_bytes_per_block,
                                  limit=f"{target.name}'s {target.max_shared_bytes_per_block}"),
        "dynamic_shared_bytes": r.integer(
            fields.get("dynamic_shared_bytes", 0), f"{path}.dynamic_shared_bytes",
            high=target.max_shared_bytes_per_block,
            limit=f"{target.name}'s {target.max_shared_bytes_per_block}"),
    }


def _region_difference(stated: dict[str, Any], code: bytes, trusted: Region,
                       origin: str) -> str | None:
    """The first way the file's region differs from the trusted one, or None."""
    difference = _params_difference(stated["params"], trusted.params, origin)
    if difference is not None:
        return difference
    for key in ("entry", "registers", "block_x", "shared_bytes", "dynamic_shared_bytes"):
        if stated[key] != getattr(trusted, key):
            return (f"{key} is {stated[key]!r} in the plan, {getattr(trusted, key)!r} "
                    f"in {origin}")
    mine, theirs = hashlib.sha256(code).hexdigest(), hashlib.sha256(trusted.code).hexdigest()
    if mine != theirs:
        return f"code sha256 {mine[:16]}... in the plan, {theirs[:16]}... in {origin}"
    return None


def _code(r: _Reader, value: Any, path: str) -> bytes:
    text = r.string(value, path, MAX_PLAN_BYTES)
    if _HEX_BYTES.fullmatch(text) is None:
        raise r.fail(path, "not lower-case hexadecimal bytes")
    return bytes.fromhex(text)


def _params(r: _Reader, value: Any, path: str) -> tuple[Param, ...]:
    return tuple(_param(r, item, f"{path}[{j}]") for j, item in enumerate(r.array(value, path)))


def _param(r: _Reader, value: Any, path: str) -> Param:
    if not isinstance(value, dict):
        raise r.fail(path, f"expected an object, not {_kind(value)}")
    if "kind" not in value:
        raise r.fail(f"{path}.kind", "missing")
    kind = r.choice(value["kind"], f"{path}.kind", ("pointer", "scalar"))
    if kind == "scalar":
        p = r.fields(value, path, ("kind", "name", "dtype"))
        dtype = r.choice(p["dtype"], f"{path}.dtype", ("f32", "u32"))
        return ScalarParam(r.name(p["name"], f"{path}.name"), dtype)  # type: ignore[arg-type]
    p = r.fields(value, path, ("kind", "name", "access", "align", "footprint"))
    fp = r.fields(p["footprint"], f"{path}.footprint", ("scale", "factors"))
    factors = tuple(r.name(f, f"{path}.footprint.factors[{k}]") for k, f in
                    enumerate(r.array(fp["factors"], f"{path}.footprint.factors", MAX_FACTORS)))
    return PointerParam(
        r.name(p["name"], f"{path}.name"),
        Footprint(r.integer(fp["scale"], f"{path}.footprint.scale"), factors),
        r.choice(p["access"], f"{path}.access", ("read", "write", "readwrite")),  # type: ignore[arg-type]
        r.power_of_two(p["align"], f"{path}.align", MAX_POINTER_ALIGNMENT),
    )


def _param_facts(param: Param) -> dict[str, str]:
    if isinstance(param, PointerParam):
        return {"kind": "pointer", "name": param.name, "access": param.access,
                "align": str(param.align), "footprint": param.footprint.describe()}
    return {"kind": "scalar", "name": param.name, "dtype": param.dtype}


def _params_difference(stated: tuple[Param, ...], trusted: tuple[Param, ...],
                       origin: str) -> str | None:
    """The first way the plan's parameter list differs from the trusted one, or None."""
    if len(stated) != len(trusted):
        return f"{len(stated)} parameters in the plan, {len(trusted)} in {origin}"
    for j, (mine, theirs) in enumerate(zip(stated, trusted, strict=True)):
        facts, truth = _param_facts(mine), _param_facts(theirs)
        for key in (*truth, *(k for k in facts if k not in truth)):
            if facts.get(key) != truth.get(key):
                return (f"params[{j}] ({theirs.name!r}) {key} is {facts.get(key)} in the plan, "
                        f"{truth.get(key)} in {origin}")
    return None


def _placed_regions(r: _Reader, value: Any, regions: tuple[Region, ...],
                    ) -> tuple[PlacedRegion, ...]:
    """Retained regions, each as long as its (trusted) code."""
    code_bytes = {region.name: len(region.code) for region in regions}
    placed: list[PlacedRegion] = []
    names: set[str] = set()
    for i, item in enumerate(r.array(value, "placed_regions", MAX_REGIONS)):
        path = f"placed_regions[{i}]"
        p = r.fields(item, path, ("name", "address", "bytes"))
        name = r.name(p["name"], f"{path}.name")
        if name not in code_bytes:
            raise r.fail(f"{path}.name", f"{_show(name)} is not a declared region")
        if name in names:
            raise r.fail(f"{path}.name", f"region {_show(name)} is placed twice")
        names.add(name)
        address = r.integer(p["address"], f"{path}.address")
        size = r.integer(p["bytes"], f"{path}.bytes")
        if size != code_bytes[name]:
            raise r.fail(f"{path}.bytes", f"{size} is not the {code_bytes[name]} bytes of "
                         f"region {_show(name)}'s code")
        r.end(address, size, path)
        placed.append(PlacedRegion(name, address, size))
    return tuple(placed)


def _tensors(r: _Reader, value: Any) -> tuple[Tensor, ...]:
    tensors: list[Tensor] = []
    names: set[str] = set()
    for i, item in enumerate(r.array(value, "tensors", MAX_TENSORS)):
        path = f"tensors[{i}]"
        t = r.fields(item, path, ("name", "dtype", "shape", "address", "bytes", "align"))
        name = r.name(t["name"], f"{path}.name")
        if name in names:
            raise r.fail(f"{path}.name", f"tensor {_show(name)} is declared twice")
        names.add(name)
        dtype = r.choice(t["dtype"], f"{path}.dtype", tuple(DTYPE_BYTES))
        shape = tuple(r.integer(n, f"{path}.shape[{k}]") for k, n in
                      enumerate(r.array(t["shape"], f"{path}.shape", MAX_SHAPE_DIMS)))
        size = r.integer(t["bytes"], f"{path}.bytes")
        implied = DTYPE_BYTES[dtype] * math.prod(shape)
        if size != implied:
            raise r.fail(f"{path}.bytes", f"{size} is not the {implied} bytes of "
                         f"{dtype}{list(shape)}")
        address = r.integer(t["address"], f"{path}.address")
        r.end(address, size, path)
        tensors.append(Tensor(name, dtype, shape, address, size,
                              r.power_of_two(t["align"], f"{path}.align")))
    return tuple(tensors)


def _launch(r: _Reader, value: Any, path: str, target: Target) -> Launch:
    launch = r.fields(value, path, ("region", "grid", "block", "args"), ("label", "cluster"))
    grid = _dim3(r, launch["grid"], f"{path}.grid", target.max_grid, target.name)
    block = _dim3(r, launch["block"], f"{path}.block", target.max_block, target.name)
    if block.count > target.max_threads_per_block:
        raise r.fail(f"{path}.block", f"{block.x} x {block.y} x {block.z} = {block.count} "
                     f"threads, above {target.name}'s {target.max_threads_per_block} per block")
    args = tuple(_arg(r, item, f"{path}.args[{j}]")
                 for j, item in enumerate(r.array(launch["args"], f"{path}.args")))
    label = r.string(launch.get("label", ""), f"{path}.label")
    # CTAs a cluster: whether its region runs in clusters of this size is the certificate's
    cluster = r.integer(launch.get("cluster", 1), f"{path}.cluster", 1, grid.x,
                        f"the launch's grid.x, {grid.x}")
    return Launch(r.string(launch["region"], f"{path}.region"), grid, block, args, label,
                  cluster)


def _dim3(r: _Reader, value: Any, path: str, limits: tuple[int, int, int],
          target_name: str) -> Dim3:
    items = r.array(value, path)
    if len(items) != 3:
        raise r.fail(path, f"expected three integers [x, y, z], not {len(items)} items")
    return Dim3(*(r.integer(item, f"{path}[{k}]", 1, limit, f"{target_name}'s {limit}")
                  for k, (item, limit) in enumerate(zip(items, limits, strict=True))))


def _arg(r: _Reader, value: Any, path: str) -> Address | Scalar:
    if not isinstance(value, dict):
        raise r.fail(path, f"expected an object, not {_kind(value)}")
    kinds = [kind for kind in ("pointer", "f32", "u32") if kind in value]
    if len(kinds) != 1:
        raise r.fail(path, "expected exactly one of 'pointer', 'f32', 'u32'")
    kind = kinds[0]
    a = r.fields(value, path, (kind,), ("value",) if kind == "f32" else ())
    if kind == "pointer":
        return Address(r.integer(a["pointer"], f"{path}.pointer"))
    scalar = Scalar(kind, r.integer(a[kind], f"{path}.{kind}", high=U32_MAX,  # type: ignore[arg-type]
                                    limit="2**32 - 1"))
    if "value" in a:
        _check_value(r, a["value"], f"{path}.value", scalar)
    return scalar


def _check_value(r: _Reader, value: Any, path: str, scalar: Scalar) -> None:
    """`value` is for readers, but one that disagrees with the bits would mislead them."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise r.fail(path, f"expected a number, not {_kind(value)}")
    exact = scalar.value
    if value != exact and not (math.isnan(value) and math.isnan(exact)):
        raise r.fail(path, f"{value!r} is not the binary32 0x{scalar.bits:08x} ({exact!r}); "
                     "the bits rule: correct or drop 'value'")


def _submission(r: _Reader, value: Any, path: str) -> Submission:
    s = r.fields(value, path, ("first_launch", "count", "semaphore"))
    return Submission(r.integer(s["first_launch"], f"{path}.first_launch"),
                      r.integer(s["count"], f"{path}.count"),
                      r.integer(s["semaphore"], f"{path}.semaphore"))


def _attributes(r: _Reader, value: Any) -> dict[str, str | int]:
    """Free-form facts: names to strings or integers, nothing nested."""
    checked: dict[str, str | int] = {}
    for key, item in r.object(value, "attributes").items():
        path = f"attributes.{key}"
        r.string(key, path)
        if isinstance(item, str):
            checked[key] = r.string(item, path, MAX_TEXT_CHARS)
        else:
            checked[key] = r.integer(item, path)
    return checked


def _figures(r: _Reader, value: Any) -> None:
    """Written for readers and ignored on reading, but still well formed."""
    figures = r.fields(value, "figures", (), _FIGURE_KEYS)
    for key, item in figures.items():
        r.integer(item, f"figures.{key}")


def _check_component_sizes(r: _Reader, plan: Plan) -> None:
    """Each component holds what the plan puts in it."""
    target, amap = plan.target, plan.address_map
    needs = (
        ("program", amap.program, plan.program_bytes,
         "the code extent and a parameter block per launch"),
        ("qmd-table", amap.qmd_table, plan.qmd_table_bytes, "a QMD per launch"),
        ("pushbuffer", amap.pushbuffer, target.pushbuffer_setup_bytes
         + plan.submission_count * target.pushbuffer_bytes_per_submission,
         "the set-up and a segment per submission"),
        ("semaphores", amap.semaphores, max(1, plan.submission_count) * SEMAPHORE_STRIDE,
         "a semaphore per submission"),
    )
    for name, component, need, what in needs:
        if component.bytes < need:
            raise r.fail(f"address_map.{name}.bytes", f"{component.bytes} bytes cannot hold "
                         f"{what} ({need} bytes)")


def loads(text: str, source: str = "<plan>", *, regions: RegionCatalogue) -> Plan:
    """The plan in JSON `text`: size, nesting and integers bounded before parsing."""
    if len(text) > MAX_PLAN_BYTES:
        raise BadInput(f"{source}: {len(text)} characters, larger than any plan "
                       f"({MAX_PLAN_BYTES >> 20} MiB)")
    if _nests_deeper_than(text, MAX_DEPTH):
        raise BadInput(f"{source}: nested more than {MAX_DEPTH} deep: not a plan "
                       "(a plan nests at most 7 deep)")
    try:
        data = json.loads(text, parse_int=_parse_int, object_pairs_hook=_object)
    except json.JSONDecodeError as error:
        raise BadInput(f"{source}: not valid JSON ({error.msg} at line {error.lineno})") from None
    return plan_from_json(data, source, regions=regions)


def read_plan(path: str, *, regions: RegionCatalogue) -> Plan:
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_PLAN_BYTES + 1)
    except OSError as error:
        raise BadInput(f"{path}: cannot read the plan ({error.strerror})") from None
    if len(raw) > MAX_PLAN_BYTES:
        raise BadInput(f"{path}: larger than any plan ({MAX_PLAN_BYTES >> 20} MiB)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise BadInput(f"{path}: not a text file (a plan is JSON from 'bob plan --json')") from None
    return loads(text, path, regions=regions)
