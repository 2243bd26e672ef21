"""`bob plan` and `bob certify`."""

from __future__ import annotations

import json
import sys

import click
from click.core import ParameterSource
from rich.console import Console
from rich.table import Table

from bob.backends.registry import (
    SPECS,
    require_kernels,
    resolve_schedule,
    resolve_submission,
    spec,
)
from bob.config import (
    AUTO_SCHEDULE,
    AUTO_SUBMISSION,
    DEFAULT_KERNELS,
    DEFAULT_TARGET,
    TARGET_NAMES,
)
from bob.errors import BackendUnavailable, BadInput
from bob.files import check_output_directory, require_regular_file, write_directory
from bob.kernels.cuda.regions import catalogue
from bob.plan import SM86, TARGETS
from bob.plan import certify as certify_plan
from bob.plan.jsonio import dumps, read_plan
from bob.plan.model import Plan
from bob.program.bob import BobConfig
from bob.program.plans import build_plan

from .options import (
    KERNELS_OPTION,
    PLAN_TABLES_OPTION,
    ByteSize,
    config_from,
    plan_options,
    submission_option,
)
from .render import print_hazards, print_plan

# A plan's submissions are its command stream's grouping, and only the backends that run
# the stream care how launches are grouped: `bob plan` shows the plan the GPU's runs.
STREAM_BACKEND = next(spec.name for spec in SPECS if spec.runs_command_stream and spec.on_gpu)


def cluster_note(plan: Plan) -> str | None:
    """One line where the plan launches clusters the stream backend does not: why not."""
    withheld = spec(STREAM_BACKEND).clusters_withheld
    if not withheld or all(launch.cluster == 1 for launch in plan.launches):
        return None
    return (f"clusters: the {STREAM_BACKEND} backend launches none ({withheld}); the cuda "
            "backend launches these")


def schedule_note(kernels: str, row_shards: bool, config: BobConfig | None = None,
                  ) -> str | None:
    """One line where --schedule was left out: the plan shown is the seed's (the
    reference), and the schedule `bob train` would run on the stream backend with these
    options (`config`'s, with Bob's own code), and why."""
    context = click.get_current_context()
    if context.get_parameter_source("schedule") is not ParameterSource.DEFAULT:
        return None
    if kernels != DEFAULT_KERNELS and config is not None and not row_shards:
        from bob.backends.registry import BackendChoice
        from bob.host.own_code import schedule_for

        stream = BackendChoice(STREAM_BACKEND, TARGETS[DEFAULT_TARGET], kernels=kernels)
        trained = schedule_for(AUTO_SCHEDULE, stream, config)
    else:
        trained = resolve_schedule(AUTO_SCHEDULE, STREAM_BACKEND, kernels, row_shards)
    return (f"schedule: seed shown (the reference); bob train on {STREAM_BACKEND} runs "
            f"{trained.text}")


def _bob_plan(vocab: int, prompts: int, updates: int, mode: str, schedule: str,
              arch: str | None, submission: str = "per-launch",
              kernels: str = DEFAULT_KERNELS, tables: str = "dense") -> Plan:
    if tables == "collapsed" and kernels != DEFAULT_KERNELS:
        from bob.host.own_code import collapsed_refusal

        refused = collapsed_refusal()
        if refused:
            raise BadInput(refused)
    config = config_from(vocab, prompts, updates, mode, schedule, submission, tables)
    if arch is None and kernels == DEFAULT_KERNELS:
        return build_plan(config)
    # Bob's own kernels are placed for the nv backend's target unless --arch names another.
    target = TARGETS[arch or DEFAULT_TARGET]
    if kernels != DEFAULT_KERNELS:
        from bob.host.own_code import require_own_plan

        require_own_plan(kernels, config, target)  # before NVRTC compiles anything
    regions = None
    if arch is not None:
        from bob.kernels.cuda.regions import compiled_regions  # NVRTC: only when asked

        try:
            regions = compiled_regions(arch)
        except ImportError as error:
            raise BackendUnavailable(
                f"--arch needs NVRTC (pip install 'bob-bigram[cuda]'): {error}") from None
    if kernels != DEFAULT_KERNELS:
        from bob.kernels.own_regions import with_own_kernels

        regions = with_own_kernels(regions, target)
    return build_plan(config, target, compiled=regions)


@click.command()
@plan_options
@submission_option("the nv backend's, chained (the plan its command stream runs); every "
                   "output says what it resolved to")
@click.option("--arch", type=click.Choice(TARGET_NAMES), default=None,
              help="Compile the kernels for this architecture and show its regions.")
@KERNELS_OPTION
@PLAN_TABLES_OPTION
@click.option("--json", "as_json", is_flag=True, help="Write the whole plan as JSON.")
@click.option("--disasm", is_flag=True,
              help="List the encoded command stream: GPFIFO entries, methods, QMD fields "
                   "(--kernels own: then Bob's own instructions, region by region).")
@click.option("--emit", "emit_dir", type=click.Path(file_okay=False),
              help="Write each encoded component (program, QMD table, ...) to DIR.")
@click.option("--shards", type=int, default=None, metavar="K",
              help="The plans of K row shards (bob train --shards): each shard's rows, arena "
                   "and certificate, then the widest shard's plan.")
@click.option("--device-memory", type=ByteSize(), default=None, metavar="SIZE",
              help="The row shards bob train --device-memory SIZE runs (512M, 8G).")
def plan(vocab: int, prompts: int, updates: int, mode: str, schedule: str, submission: str,
         arch: str | None, kernels: str, tables: str, as_json: bool, disasm: bool,
         emit_dir: str | None, shards: int | None, device_memory: int | None) -> None:
    """Show Bob's device program: arena, regions, launches, submissions, sizes."""
    require_kernels(kernels, (STREAM_BACKEND,))  # the plan the nv backend runs
    if shards is not None or device_memory is not None:
        if kernels != DEFAULT_KERNELS:
            raise BadInput("row shards (--shards, --device-memory) do not take --kernels own")
        if tables != "dense":
            raise BadInput("row shards (--shards, --device-memory) are of dense tables: "
                           "collapsed ones train in one piece")
        if disasm or emit_dir:
            raise BadInput("--disasm and --emit show one plan's command stream; a shard's is "
                           "that of its rows: drop --shards and --device-memory")
        _shard_plans(vocab, updates, mode, schedule, arch, as_json, shards, device_memory)
        note = None if as_json else schedule_note(kernels, row_shards=True)
        if note:
            click.echo(note, err=True)
        return
    if emit_dir:
        check_output_directory(emit_dir, "components")  # before the plan is built
    policy = resolve_submission(submission, STREAM_BACKEND)
    the_plan = _bob_plan(vocab, prompts, updates, mode, schedule, arch, policy, kernels,
                         tables)
    certificate = certify_plan(the_plan)
    if as_json:
        click.echo(dumps(the_plan))  # its submission_policy says what auto resolved to
        return
    if disasm or emit_dir:
        from bob.backends.nv.decoder import disassemble
        from bob.backends.nv.encoder import emitted, encode

        encoded = encode(the_plan)
        if emit_dir:
            for path in write_directory(emit_dir, emitted(encoded), "components"):
                click.echo(path)
        if disasm:
            click.echo(disassemble(encoded, the_plan))
            if kernels != DEFAULT_KERNELS:
                click.echo(_own_listing(the_plan))
    else:
        print_plan(Console(width=None if sys.stdout.isatty() else 160), the_plan, certificate)
    shown = config_from(vocab, prompts, updates, mode, "seed", policy, tables)
    for note in (cluster_note(the_plan), schedule_note(kernels, False, shown),
                 _tables_note(vocab, mode, tables)):
        if note:
            click.echo(note, err=True)
    if submission == AUTO_SUBMISSION:  # on stderr, after the output: --emit lists paths
        click.echo(f"submission: auto is {policy} (the {STREAM_BACKEND} backend's default)",
                   err=True)


def _tables_note(vocab: int, mode: str, tables: str) -> str | None:
    """Where `bob train` would hold the typical data's tables otherwise than this plan
    does: which, and why (None where it holds them so)."""
    from bob.host.tables import choose_tables
    from bob.program.bob import typical_pairs

    named = typical_pairs(vocab) if mode == "corpus" else vocab
    chosen = choose_tables("auto", vocab, named)
    if chosen.tables == tables:
        return None
    return (f"tables: {tables} shown; bob train would hold them {chosen.tables} on data "
            f"naming {named:,} cells ({chosen.reason})")


def _own_listing(the_plan: Plan) -> str:
    """Bob's own instructions of the plan's regions that carry them, as nvdisasm prints."""
    from bob.kernels.own_regions import OWN_REGIONS, own_listing

    placed = {region.name for region in the_plan.placed_regions}
    return own_listing(the_plan.target, tuple(name for name in OWN_REGIONS if name in placed))


def _shard_plans(vocab: int, updates: int, mode: str, schedule: str, arch: str | None,
                 as_json: bool, shards: int | None, budget: int | None) -> None:
    """The row shards of a sharded run (bob.host.sharded): a plan per distinct shard size
    (a shard's plan depends on its row count alone, its rows aside), each certified."""
    from bob.host.sharded import require_shard_fits, shard_config, shards_for_budget
    from bob.program.bob import shard_boundaries

    if schedule != "seed":
        raise BadInput("row shards run the seed schedule: --schedule fused is not for "
                       "--shards or --device-memory")
    if shards is not None and (isinstance(shards, bool) or shards < 1):
        raise BadInput(f"--shards must be an integer of at least 1, not {shards}")
    target = TARGETS[arch] if arch is not None else SM86
    compiled = None
    if arch is not None:
        from bob.kernels.cuda.regions import compiled_regions  # NVRTC: only when asked

        compiled = compiled_regions(arch)
    if shards is None:
        shards = shards_for_budget(vocab, mode, updates, budget, target)  # type: ignore[arg-type]
    elif budget is not None:
        require_shard_fits(vocab, mode, updates, shards, budget, target)  # type: ignore[arg-type]
    boundaries = shard_boundaries(vocab, shards)
    plans: dict[int, tuple[Plan, object]] = {}
    for rows in boundaries:
        size = rows[1] - rows[0]
        if size not in plans:
            the_plan = build_plan(shard_config(vocab, mode, updates, rows), target,  # type: ignore[arg-type]
                                  compiled=compiled)
            plans[size] = (the_plan, certify_plan(the_plan))
    if as_json:
        click.echo(json.dumps({"vocab": vocab, "mode": mode, "updates": updates,
                               "device_memory": budget, "shards": [
            {"rows": list(rows), "arena_bytes": plans[rows[1] - rows[0]][0].arena_bytes,
             "certified": plans[rows[1] - rows[0]][1].holds} for rows in boundaries]}))
        return
    console = Console(width=None if sys.stdout.isatty() else 160)
    budget_text = "" if budget is None else f", at most {budget:,} bytes of device memory each"
    table = Table(title=f"Row shards: {shards} of V={vocab} ({mode}, N={updates}{budget_text})")
    for column in ("shard", "rows", "row count", "arena bytes", "certified"):
        table.add_column(column, justify="right" if column != "rows" else "left")
    for i, rows in enumerate(boundaries):
        the_plan, certificate = plans[rows[1] - rows[0]]
        table.add_row(str(i + 1), f"[{rows[0]}, {rows[1]})", f"{rows[1] - rows[0]:,}",
                      f"{the_plan.arena_bytes:,}", "yes" if certificate.holds else "NO")
    console.print(table)
    widest = max(boundaries, key=lambda rows: rows[1] - rows[0])
    console.print(f"The plan of shard {boundaries.index(widest) + 1}, rows [{widest[0]}, "
                  f"{widest[1]}) (every shard's plan is this one for its own rows):",
                  markup=False, highlight=False)
    print_plan(console, *plans[widest[1] - widest[0]])  # type: ignore[arg-type]


@click.command()
@plan_options
@click.option("--plan", "plan_file", type=click.Path(dir_okay=False),
              help="Certify this plan (JSON from 'bob plan --json') instead of Bob's own.")
@click.option("--json", "as_json", is_flag=True, help="Print the verdict as JSON.")
def certify(vocab: int, prompts: int, updates: int, mode: str, schedule: str,
            plan_file: str | None, as_json: bool) -> None:
    """Certify a plan: exit 0 when it holds, 1 with every hazard listed otherwise."""
    if plan_file is not None:
        require_regular_file(plan_file, "plan")  # a FIFO would block the read
        the_plan = read_plan(plan_file, regions=catalogue())
    else:
        the_plan = build_plan(config_from(vocab, prompts, updates, mode, schedule))
    certificate = certify_plan(the_plan)
    if as_json:
        click.echo(json.dumps({
            "certified": certificate.holds,
            "plan": plan_file or "bob",
            "hazards": [h.to_json() for h in certificate.hazards],
        }, indent=1))
    else:
        print_hazards(Console(), certificate)
    if not certificate.holds:
        click.get_current_context().exit(1)


COMMANDS = (plan, certify)
