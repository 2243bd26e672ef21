"""Bob's own machine code for the plan's regions, written with ``bob.isa.builder``: no
compiler, no cubin. ``asm`` holds what every kernel is written with; each module beside
it holds one family of kernels and its ``BUILDERS`` (region -> a function of the target
architecture that returns the image).

    image(sig.GATHER, "sm_90")     # an Image: code, registers, shared bytes
"""

from __future__ import annotations

from bob.isa.builder import Image
from bob.kernels import signatures as sig
from bob.kernels.own import (
    collapsed_fused,
    collapsed_io,
    collapsed_loss,
    fused,
    health,
    seed,
    sparse,
)
from bob.kernels.own.asm import (  # noqa: F401 - the names the kernels' tests use
    LANES,
    TID_X,
    Asm,
    Scratch,
    divide,
    p,
    r,
    square_root,
)
from bob.kernels.own.seed import (  # noqa: F401
    adamw,
    greedy_argmax,
    loss_gradient_corpus,
    loss_gradient_hard,
    row_gather,
)

# Every region Bob has its own machine code for, by the family that writes it.
BUILDERS = {**seed.BUILDERS, **fused.BUILDERS, **sparse.BUILDERS, **health.BUILDERS,
            **collapsed_io.BUILDERS, **collapsed_loss.BUILDERS, **collapsed_fused.BUILDERS}
# The largest vocabulary a region's own code serves, where it has one (a register-resident
# kernel holds a row of at most so many columns); a plan past it runs no own code there.
VOCAB_LIMITS: dict[str, int] = {sig.FUSED_HARD: fused.RESIDENT_VOCAB,
                                 sig.FUSED_CORPUS: fused.RESIDENT_VOCAB,
                                 **collapsed_io.VOCAB_LIMITS}


def covers(region: str, vocab: int) -> bool:
    """Whether Bob's own code runs `region` in a plan of vocabulary `vocab`."""
    return region in BUILDERS and vocab <= VOCAB_LIMITS.get(region, vocab)


def image(region: str, arch: str) -> Image:
    """Bob's own image of `region` for `arch`."""
    try:
        build = BUILDERS[region]
    except KeyError:
        raise ValueError(f"Bob has no own machine code for {region!r}; it has "
                         f"{', '.join(BUILDERS)}") from None
    return build(arch)
