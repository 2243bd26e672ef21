"""The plan as JSON: a documented, versioned schema that round-trips exactly.

Addresses are written as hex strings, binary32 scalars by their bit pattern
(with the decimal value beside it for readers), machine code as hex. The
schema is described in docs/PLAN-FORMAT.md. ``figures`` is written for
readers and ignored on reading: the figures follow from the plan.
"""

from __future__ import annotations

import json
from typing import Any

from bob.config import DEFAULT_SUBMISSION_POLICY, SUBMISSION_POLICIES
from bob.errors import BadInput
from bob.plan.model import (
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
    Scalar,
    ScalarParam,
    Submission,
    Target,
    Tensor,
)

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
                "shared_bytes": r.shared_bytes, "params": [_param_json(p) for p in r.params],
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
        "launches": [
            {"region": launch.region, "label": launch.label,
             "grid": [launch.grid.x, launch.grid.y, launch.grid.z],
             "block": [launch.block.x, launch.block.y, launch.block.z],
             "args": [_arg_json(a) for a in launch.args]}
            for launch in plan.launches
        ],
        "submissions": [
            {"first_launch": s.first_launch, "count": s.count, "semaphore": s.semaphore}
            for s in plan.submissions
        ],
        "forward_launches": plan.forward_launches,
        "forward_submissions": plan.forward_submissions,
        "submission_policy": plan.submission_policy,
        "attributes": plan.attributes,
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


class _Reader:
    """Reads fields with errors that name the file and the JSON path."""

    def __init__(self, source: str):
        self.source = source

    def fail(self, path: str, problem: str) -> BadInput:
        return BadInput(f"{self.source}: {path}: {problem}")

    def get(self, obj: Any, key: str, path: str) -> Any:
        if not isinstance(obj, dict):
            raise self.fail(path, "expected an object")
        if key not in obj:
            raise self.fail(f"{path}.{key}" if path else key, "missing")
        return obj[key]

    def integer(self, obj: Any, key: str, path: str) -> int:
        value = self.get(obj, key, path)
        where = f"{path}.{key}" if path else key
        if isinstance(value, bool):
            raise self.fail(where, "expected an integer")
        if isinstance(value, int):
            return value
        if isinstance(value, str):
            try:
                return int(value, 0)
            except ValueError:
                raise self.fail(where, f"{value!r} is not an integer") from None
        raise self.fail(where, "expected an integer")

    def string(self, obj: Any, key: str, path: str) -> str:
        value = self.get(obj, key, path)
        if not isinstance(value, str):
            raise self.fail(f"{path}.{key}", "expected a string")
        return value

    def array(self, obj: Any, key: str, path: str) -> list:
        value = self.get(obj, key, path)
        if not isinstance(value, list):
            raise self.fail(f"{path}.{key}" if path else key, "expected an array")
        return value


def plan_from_json(data: Any, source: str = "<plan>") -> Plan:
    r = _Reader(source)
    if r.get(data, "format", "") != FORMAT:
        raise r.fail("format", f"not a Bob plan (expected {FORMAT!r}; write one with "
                     "'bob plan --json')")
    version = r.integer(data, "version", "")
    if version != VERSION:
        raise r.fail("version", f"plan format version {version} is not supported "
                     f"(this Bob reads version {VERSION})")
    t = r.get(data, "target", "")
    target = Target(
        name=r.string(t, "name", "target"),
        parameter_base=r.integer(t, "parameter_base", "target"),
        parameter_block_bytes=r.integer(t, "parameter_block_bytes", "target"),
        qmd_record_bytes=r.integer(t, "qmd_record_bytes", "target"),
        qmd_stride_bytes=r.integer(t, "qmd_stride_bytes", "target"),
        pushbuffer_setup_bytes=r.integer(t, "pushbuffer_setup_bytes", "target"),
        pushbuffer_bytes_per_submission=r.integer(t, "pushbuffer_bytes_per_submission", "target"),
    )
    amap = r.get(data, "address_map", "")
    components = []
    for name in ("program", "qmd-table", "pushbuffer", "semaphores", "arena"):
        c = r.get(amap, name, "address_map")
        path = f"address_map.{name}"
        components.append(Component(name, r.integer(c, "base", path), r.integer(c, "bytes", path)))

    regions = []
    for i, reg in enumerate(r.array(data, "regions", "")):
        path = f"regions[{i}]"
        params = tuple(_param_from_json(r, p, f"{path}.params[{j}]")
                       for j, p in enumerate(r.array(reg, "params", path)))
        try:
            code = bytes.fromhex(r.string(reg, "code", path))
        except ValueError:
            raise r.fail(f"{path}.code", "not hexadecimal") from None
        regions.append(Region(
            name=r.string(reg, "name", path), code=code,
            registers=r.integer(reg, "registers", path), block_x=r.integer(reg, "block_x", path),
            shared_bytes=r.integer(reg, "shared_bytes", path), params=params,
            entry=r.string(reg, "entry", path),
        ))
    placed = tuple(
        PlacedRegion(r.string(p, "name", f"placed_regions[{i}]"),
                     r.integer(p, "address", f"placed_regions[{i}]"),
                     r.integer(p, "bytes", f"placed_regions[{i}]"))
        for i, p in enumerate(r.array(data, "placed_regions", ""))
    )
    tensors = []
    for i, t in enumerate(r.array(data, "tensors", "")):
        path = f"tensors[{i}]"
        shape = r.array(t, "shape", path)
        if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape):
            raise r.fail(f"{path}.shape", "expected non-negative integers")
        tensors.append(Tensor(
            r.string(t, "name", path), r.string(t, "dtype", path), tuple(shape),
            r.integer(t, "address", path), r.integer(t, "bytes", path),
            r.integer(t, "align", path),
        ))
    launches = []
    for i, launch in enumerate(r.array(data, "launches", "")):
        path = f"launches[{i}]"
        grid, block = (_dim3(r, launch, key, path) for key in ("grid", "block"))
        args = tuple(_arg_from_json(r, a, f"{path}.args[{j}]")
                     for j, a in enumerate(r.array(launch, "args", path)))
        label = launch.get("label", "") if isinstance(launch, dict) else ""
        launches.append(Launch(r.string(launch, "region", path), grid, block, args, str(label)))
    submissions = tuple(
        Submission(r.integer(s, "first_launch", f"submissions[{i}]"),
                   r.integer(s, "count", f"submissions[{i}]"),
                   r.integer(s, "semaphore", f"submissions[{i}]"))
        for i, s in enumerate(r.array(data, "submissions", ""))
    )
    attributes = data.get("attributes", {})
    if not isinstance(attributes, dict):
        raise r.fail("attributes", "expected an object")
    # Absent in plans written before the policy existed: they are per-launch.
    policy = data.get("submission_policy", DEFAULT_SUBMISSION_POLICY)
    if policy not in SUBMISSION_POLICIES:
        raise r.fail("submission_policy", f"expected one of {', '.join(SUBMISSION_POLICIES)}, "
                     f"not {policy!r}")
    return Plan(
        target=target,
        address_map=AddressMap(*components),
        region_alignment=r.integer(data, "region_alignment", ""),
        page_bytes=r.integer(data, "page_bytes", ""),
        regions=tuple(regions),
        placed_regions=placed,
        code_extent=r.integer(data, "code_extent", ""),
        tensors=tuple(tensors),
        launches=tuple(launches),
        submissions=submissions,
        forward_launches=r.integer(data, "forward_launches", ""),
        forward_submissions=r.integer(data, "forward_submissions", ""),
        submission_policy=policy,
        attributes=attributes,
    )


def loads(text: str, source: str = "<plan>") -> Plan:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise BadInput(f"{source}: not valid JSON ({error.msg} at line {error.lineno})") from None
    return plan_from_json(data, source)


def read_plan(path: str) -> Plan:
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as error:
        raise BadInput(f"{path}: cannot read the plan ({error.strerror})") from None
    except UnicodeDecodeError:
        raise BadInput(f"{path}: not a text file (a plan is JSON from 'bob plan --json')") from None
    return loads(text, path)


def _dim3(r: _Reader, obj: Any, key: str, path: str) -> Dim3:
    values = r.array(obj, key, path)
    if len(values) != 3 or not all(isinstance(v, int) and not isinstance(v, bool)
                                   for v in values):
        raise r.fail(f"{path}.{key}", "expected three integers")
    return Dim3(*values)


def _param_from_json(r: _Reader, p: Any, path: str) -> Param:
    kind = r.string(p, "kind", path)
    name = r.string(p, "name", path)
    if kind == "pointer":
        fp = r.get(p, "footprint", path)
        factors = r.array(fp, "factors", f"{path}.footprint")
        if not all(isinstance(f, str) for f in factors):
            raise r.fail(f"{path}.footprint.factors", "expected names")
        access = r.string(p, "access", path)
        if access not in ("read", "write", "readwrite"):
            raise r.fail(f"{path}.access", f"unknown access {access!r}")
        return PointerParam(name, Footprint(r.integer(fp, "scale", f"{path}.footprint"),
                                            tuple(factors)),
                            access, r.integer(p, "align", path))  # type: ignore[arg-type]
    if kind == "scalar":
        dtype = r.string(p, "dtype", path)
        if dtype not in ("f32", "u32"):
            raise r.fail(f"{path}.dtype", f"unknown scalar type {dtype!r}")
        return ScalarParam(name, dtype)  # type: ignore[arg-type]
    raise r.fail(f"{path}.kind", f"unknown parameter kind {kind!r}")


def _arg_from_json(r: _Reader, a: Any, path: str) -> Address | Scalar:
    if not isinstance(a, dict):
        raise r.fail(path, "expected an object")
    if "pointer" in a:
        return Address(r.integer(a, "pointer", path))
    if "f32" in a:
        return Scalar("f32", r.integer(a, "f32", path))
    if "u32" in a:
        return Scalar("u32", r.integer(a, "u32", path))
    raise r.fail(path, "expected one of 'pointer', 'f32', 'u32'")
