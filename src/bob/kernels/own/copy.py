"""The nv backend's snapshot copy kernels in Bob's own machine code: ``bob_copy_16`` and
``bob_copy_4`` of ``bob.kernels.cuda.snapshot``, for where NVRTC is not installed.

They are no plan regions: three 8-byte parameters (source, destination, the count of
units) and a grid-stride copy of 16-byte (LDG.E.128 / STG.E.128) or 4-byte units. The
loop runs over a block-wide 64-bit base, as ``seed.adamw``'s (uniform branches); a round
moves UNROLL units a lane, ``stride`` = gridDim.x * 256 apart, all loaded before any is
stored so that several loads are in flight, each under its lane's predicate.

    copy_image("bob_copy_16", "sm_90")     # an Image
"""

from __future__ import annotations

from bob.isa.builder import Image
from bob.isa.model import RZ, CBuf, GMem
from bob.kernels.own.asm import DESC, LANES, Asm, p, r

UNITS = {"bob_copy_16": 16, "bob_copy_4": 4}  # entry -> the bytes one unit is
ARGUMENTS = ("source", "destination", "count")  # 8 bytes each, in this order
ARGUMENT_BYTES = 8
UNROLL = 4  # units a lane loads before it stores: one predicate each, P0..P3

# Registers: 64-bit values in aligned pairs, a 16-byte unit in an aligned four. The units'
# addresses are the sources' for the loads, then the destinations' (the loads have read
# theirs by then: the schedule waits on their read scoreboards).
TID, CTAID, X = 0, 1, 2
COUNT, SOURCE, DESTINATION, STRIDE, ROUND, BASE, INDEX = 4, 6, 8, 10, 12, 14, 16
ADDRESSES = (18, 20, 22, 24)
DATA = {16: (28, 32, 36, 40), 4: (28, 29, 30, 31)}  # by unit: each unit's registers


def _addresses(s: Asm, pointer: int, unit: int, guards: bool) -> None:
    """ADDRESSES[k] := pointer + unit * (base + tid + k * stride), and with `guards`
    P<k> := that index is below count."""
    s.wide(INDEX, r(TID), 1, BASE)
    for k, address in enumerate(ADDRESSES):
        if k:
            s.wide(INDEX, r(STRIDE), 1, INDEX)
            s.add(INDEX + 1, r(INDEX + 1), r(STRIDE + 1))
        if guards:
            s.isetp(k, "LT", r(INDEX), r(COUNT))
            s.isetp_ex(k, "LT", r(INDEX + 1), r(COUNT + 1), p(k))
        s.wide(address, r(INDEX), unit, pointer)
        s.mad(address + 1, r(INDEX + 1), unit, r(address + 1))


def copy(arch: str, entry: str) -> Image:
    """`entry`'s image for `arch`: destination[i] = source[i] for every unit i < count."""
    unit = UNITS[entry]
    s = Asm(arch, ())
    base = s.facts.parameter_base
    s.prologue(TID, CTAID, scratch=X)
    for register, index in ((SOURCE, 0), (DESTINATION, 1), (COUNT, 2)):
        s.op("LDC", r(register), CBuf(0, base + index * ARGUMENT_BYTES, index=RZ), mods="64")
    s.op("LDC", r(X), CBuf(0, 0xC, index=RZ))  # gridDim.x
    s.wide(STRIDE, r(X), LANES, RZ)
    s.wide(ROUND, r(X), LANES * UNROLL, RZ)
    s.wide(BASE, r(CTAID), LANES, RZ)
    top, end = s.fresh("round"), s.fresh("copied")
    s.b.label(top)
    s.isetp(6, "GE", r(BASE), r(COUNT))
    s.isetp_ex(6, "GE", r(BASE + 1), r(COUNT + 1), p(6))
    s.b.bra(end, guard=p(6))
    size = "128" if unit == 16 else ""
    _addresses(s, SOURCE, unit, guards=True)
    for k, (address, data) in enumerate(zip(ADDRESSES, DATA[unit], strict=True)):
        s.op("LDG.E", r(data), GMem(address, 0, DESC), mods=size, guard=p(k))
    _addresses(s, DESTINATION, unit, guards=False)
    for k, (address, data) in enumerate(zip(ADDRESSES, DATA[unit], strict=True)):
        s.op("STG.E", GMem(address, 0, DESC), r(data), mods=size, guard=p(k))
    s.wide(BASE, r(ROUND), 1, BASE)
    s.add(BASE + 1, r(BASE + 1), r(ROUND + 1))
    s.b.bra(top)
    s.b.label(end)
    s.exit()
    return s.image(entry)


def copy_image(entry: str, arch: str) -> Image:
    """Bob's own image of the copy kernel `entry` ("bob_copy_16", "bob_copy_4")."""
    if entry not in UNITS:
        raise ValueError(f"no copy kernel {entry!r}; there are {', '.join(UNITS)}")
    return copy(arch, entry)
