"""Bob's programs by the layout of their tables: the dense one (the seed's program, the
reference) and the collapsed one; every caller that holds a configuration of either
builds its plan here."""

from __future__ import annotations

from bob.config import Hyper
from bob.plan.model import Plan, ProgramSpec, Region, Target
from bob.plan.placement import SM86, place
from bob.program import bob, collapsed
from bob.program.bob import BobConfig


def build_program(config: BobConfig, target: Target = SM86, hyper: Hyper = Hyper(),
                  first_step: int = 1, compiled: dict[str, Region] | None = None,
                  ) -> ProgramSpec:
    """The program of `config`'s tables for `target`."""
    program = collapsed if config.collapsed else bob
    return program.build_program(config, target, hyper, first_step, compiled)


def build_plan(config: BobConfig, target: Target = SM86, hyper: Hyper = Hyper(),
               first_step: int = 1, compiled: dict[str, Region] | None = None) -> Plan:
    return place(build_program(config, target, hyper, first_step, compiled), target)


def declared_regions(config: BobConfig, target: Target = SM86,
                     compiled: dict[str, Region] | None = None) -> tuple[Region, ...]:
    """The regions `config`'s program declares."""
    if config.collapsed:
        return collapsed.declared_regions(config, compiled)
    return bob.declared_regions(config, target, compiled)
