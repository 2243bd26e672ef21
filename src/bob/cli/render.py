"""Readable tables of a plan (rich)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from bob.plan.certificate import Certificate
from bob.plan.model import Address, Plan


def _arg_text(plan: Plan, arg) -> str:
    if isinstance(arg, Address):
        tensor = plan.tensor_at(arg.address)
        where = f"{tensor.name}+{arg.address - tensor.address}" if tensor else "?"
        return f"{where}"
    if arg.dtype == "f32":
        return f"{arg.value:.9g}"
    return str(arg.bits)


def print_plan(console: Console, plan: Plan, certificate: Certificate) -> None:
    amap = Table(title="Virtual address map")
    for column in ("component", "address", "bytes"):
        amap.add_column(column, justify="right" if column == "bytes" else "left")
    for component in plan.address_map.components:
        amap.add_row(component.name, f"0x{component.base:x}", f"{component.bytes:,}")
    console.print(amap)

    arena = Table(title="Arena")
    for column in ("tensor", "dtype", "shape", "address", "bytes"):
        arena.add_column(column, justify="right" if column == "bytes" else "left")
    for t in plan.tensors:
        arena.add_row(t.name, t.dtype, "x".join(map(str, t.shape)), f"0x{t.address:x}",
                      f"{t.bytes:,}")
    console.print(arena)

    regions = Table(title=f"Regions ({plan.target.name})")
    for column in ("region", "entry", "address", "code bytes", "registers", "block", "shared"):
        regions.add_column(column)
    placed = {p.name: p for p in plan.placed_regions}
    for r in plan.regions:
        p = placed.get(r.name)
        regions.add_row(r.name, r.entry, f"0x{p.address:x}" if p else "pruned",
                        f"{len(r.code):,}", str(r.registers), str(r.block_x), str(r.shared_bytes))
    console.print(regions)

    launches = Table(title="Launches")
    for column in ("#", "label", "region", "grid", "block", "parameter block", "arguments"):
        launches.add_column(column)
    for i, launch in enumerate(plan.launches):
        region = plan.region(launch.region) if launch.region in {r.name for r in plan.regions} \
            else None
        names = [p.name for p in region.params] if region else [""] * len(launch.args)
        args = ", ".join(f"{n}={_arg_text(plan, a)}" for n, a in zip(names, launch.args,
                                                                     strict=False))
        launches.add_row(str(i), launch.label, launch.region, str(launch.grid.x),
                         str(launch.block.x), f"0x{plan.parameter_block_address(i):x}", args)
    console.print(launches)

    subs = Table(title=f"Submissions ({plan.submission_policy})")
    for column in ("#", "launches", "semaphore"):
        subs.add_column(column)
    for i, s in enumerate(plan.submissions):
        last = s.first_launch + s.count - 1
        rng = str(s.first_launch) if s.count == 1 else f"{s.first_launch}..{last}"
        subs.add_row(str(i), rng, str(s.semaphore))
    console.print(subs)

    totals = Table(title="Totals")
    totals.add_column("figure")
    totals.add_column("value", justify="right")
    for name, value in (
        ("launches", plan.launch_count),
        ("submissions", plan.submission_count),
        ("forward launches", plan.forward_launches),
        ("code extent bytes", plan.code_extent),
        ("program bytes", plan.program_bytes),
        ("QMD table bytes", plan.qmd_table_bytes),
        ("arena bytes", plan.arena_bytes),
    ):
        totals.add_row(name, f"{value:,}")
    totals.add_row("certificate", "holds" if certificate.holds else
                   f"FAILS ({len(certificate.hazards)} hazards)")
    console.print(totals)


def print_hazards(console: Console, certificate: Certificate) -> None:
    """One line per hazard, so the report reads the same in a terminal and a pipe."""
    if certificate.holds:
        console.print("certified: no hazards")
        return
    console.print(f"NOT certified: {len(certificate.hazards)} hazards", markup=False)
    for hazard in certificate.hazards:
        console.print(f"  {hazard}", markup=False, soft_wrap=True)
