"""A CPU emulator of the instruction subset Bob's own kernels use: a test double.

It executes encoded bytes (each instruction decoded by ``bob.isa.codec``), one
block at a time, warp by warp: 32 lanes, registers and predicates per lane,
uniform registers per warp (SHFL and VOTE read a warp's lanes), shared memory per
block, global memory as one
byte array (a RED's 64-bit add applied lane by lane, as atomics). A warp runs
until it reaches BAR.SYNC or EXIT; the barrier opens when every warp of the
block has reached it. Between two barriers a shared word one warp writes may be
neither read nor written by another (unless it writes the same value): such a race
is an error, whatever order the warps would run in. Branches must be uniform over a
warp (Bob's kernels keep them so, a VOTE's verdict being one way): a divergent one
is an error here.

Arithmetic is IEEE binary32 round-to-nearest-even, subnormals kept unless the
instruction says FTZ. FFMA is fused: the product is exact in binary64, the sum
is rounded to odd in binary64 and then to binary32, which is the correctly
rounded fused result. MUFU.RCP and MUFU.RSQ are modelled as the correctly
rounded value with FTZ inputs and outputs, optionally `perturb` ulps off (by
the bits), so tests show the kernels' results do not depend on them.

Scheduling controls are not interpreted: ``bob.isa.check`` verifies them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from bob.isa import table as arch_table
from bob.isa.codec import decode
from bob.isa.fields import INSTRUCTION_BYTES
from bob.isa.model import PT, RZ, URZ, CBuf, GMem, Imm, Pred, Reg, SMem, Target, UReg

WARP = 32
U32 = np.uint32
MASK32 = 0xFFFFFFFF


class EmulatorError(RuntimeError):
    """The program did something the emulator does not model, or trapped."""


def _f(bits: np.ndarray) -> np.ndarray:
    return np.asarray(bits, U32).view(np.float32)


def _b(values: np.ndarray) -> np.ndarray:
    return np.asarray(values, np.float32).view(U32)


def _ftz(bits: np.ndarray) -> np.ndarray:
    bits = np.asarray(bits, U32)
    subnormal = (bits & 0x7F800000) == 0
    return np.where(subnormal, bits & 0x80000000, bits).astype(U32)


def fma32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """The correctly rounded a * b + c of binary32 arrays (as binary32)."""
    with np.errstate(all="ignore"):
        a64, b64, c64 = (np.asarray(x, np.float32).astype(np.float64) for x in (a, b, c))
        p = a64 * b64  # exact: 48 bits, and no binary32 product under- or overflows binary64
        s = p + c64
        bb = s - p
        err = (p - (s - bb)) + (c64 - bb)  # s + err == p + c exactly (two-sum)
        bits = s.view(np.uint64)
        even = (bits & 1) == 0
        adjust = np.isfinite(s) & (err != 0) & even
        toward = np.where(err > 0, np.inf, -np.inf)
        s = np.where(adjust, np.nextafter(s, toward), s)  # round to odd
        return s.astype(np.float32)


@dataclass
class Launch:
    """One grid: code, constant bank 0 and the memories, and what the MUFU model does."""

    code: bytes
    arch: str
    constants: bytes  # constant bank 0
    memory: np.ndarray  # global memory bytes (uint8), address `base` at index 0
    base: int
    block: int = 256
    grid: int = 1
    shared_bytes: int = 0
    perturb: int = 0  # MUFU results are this many ulps (bits) off
    max_steps: int = 50_000_000
    blocks: tuple[int, ...] | None = None  # run only these blocks (rows are independent)
    steps: int = field(default=0, init=False)

    def run(self) -> None:
        self.table = arch_table(self.arch)
        count = len(self.code) // INSTRUCTION_BYTES
        self.program = [decode(self.code[i * INSTRUCTION_BYTES:(i + 1) * INSTRUCTION_BYTES],
                               self.table) for i in range(count)]
        for ctaid in range(self.grid) if self.blocks is None else self.blocks:
            self._run_block(ctaid)

    # -- a block ------------------------------------------------------------------------
    def _run_block(self, ctaid: int) -> None:
        if self.block % WARP:
            raise EmulatorError("blocks are whole warps here")
        shared = np.zeros(max(self.shared_bytes, 4), np.uint8)
        self.races = SharedRaces(len(shared) // 4)
        warps = [Warp(self, ctaid, w, shared) for w in range(self.block // WARP)]
        while True:
            for warp in warps:
                if not warp.exited:
                    warp.run_to_barrier()
            live = [w for w in warps if not w.exited]
            if not live:
                return
            if len(live) != len(warps):
                raise EmulatorError("some warps exited while others wait at a barrier")
            for warp in live:
                warp.at_barrier = False
            self.races.clear()

    def constant(self, offset: int, size: int = 4) -> int:
        if offset + size > len(self.constants):
            raise EmulatorError(f"constant bank read at {offset:#x} past its end")
        return int.from_bytes(self.constants[offset:offset + size], "little")

    def global_index(self, addresses: np.ndarray, size: int) -> np.ndarray:
        index = addresses.astype(np.int64) - self.base
        if (index < 0).any() or (index + size > len(self.memory)).any():
            bad = int(addresses[(index < 0) | (index + size > len(self.memory))][0])
            raise EmulatorError(f"global access at {bad:#x} outside the memory")
        if (index % size).any():
            raise EmulatorError("misaligned global access")
        return index


class Warp:
    def __init__(self, launch: Launch, ctaid: int, warp: int, shared: np.ndarray):
        self.launch = launch
        self.table = launch.table
        self.ctaid = ctaid
        self.tid = np.arange(warp * WARP, (warp + 1) * WARP, dtype=U32)
        self.shared = shared
        self.r = np.zeros((256, WARP), U32)
        self.p = np.zeros((8, WARP), bool)
        self.p[PT] = True
        self.ur = np.zeros(64, U32)
        self.pc = 0
        self.exited = False
        self.at_barrier = False

    # -- operands -------------------------------------------------------------------------
    def reg(self, operand) -> np.ndarray:
        if isinstance(operand, Reg):
            value = np.zeros(WARP, U32) if operand.index == RZ else self.r[operand.index].copy()
        elif isinstance(operand, UReg):
            value = np.full(WARP, 0 if operand.index == URZ else self.ur[operand.index], U32)
        elif isinstance(operand, Imm):
            value = np.full(WARP, operand.value, U32)
        elif isinstance(operand, CBuf):
            value = np.full(WARP, self.launch.constant(operand.offset), U32)
        else:
            raise EmulatorError(f"operand {operand!r} is not a value")
        return value

    def fval(self, operand) -> np.ndarray:
        """A float source's bits with its negation and absolute value applied."""
        bits = self.reg(operand)
        if getattr(operand, "abs", False):
            bits &= U32(0x7FFFFFFF)
        if getattr(operand, "neg", False):
            bits ^= U32(0x80000000)
        return bits

    def ival(self, operand) -> np.ndarray:
        value = self.reg(operand)
        if getattr(operand, "neg", False):
            value = (-value.astype(np.int64)).astype(np.int64) & MASK32
        return value.astype(np.uint64)

    def pred(self, operand: Pred) -> np.ndarray:
        value = self.p[operand.index].copy()
        return ~value if operand.inverted else value

    def write(self, operand: Reg, value: np.ndarray, guard: np.ndarray) -> None:
        if operand.index == RZ:
            return
        value = np.asarray(value).astype(np.uint64) & MASK32
        self.r[operand.index] = np.where(guard, value.astype(U32), self.r[operand.index])

    def write_pred(self, operand: Pred, value: np.ndarray, guard: np.ndarray) -> None:
        if operand.index != PT:
            self.p[operand.index] = np.where(guard, value, self.p[operand.index])

    # -- running ----------------------------------------------------------------------------
    def run_to_barrier(self) -> None:
        while not self.exited and not self.at_barrier:
            self.launch.steps += 1
            if self.launch.steps > self.launch.max_steps:
                raise EmulatorError("the program ran too long")
            if self.pc // INSTRUCTION_BYTES >= len(self.launch.program):
                raise EmulatorError(f"ran past the end of the code at {self.pc:#x}")
            instruction = self.launch.program[self.pc // INSTRUCTION_BYTES]
            self.pc += INSTRUCTION_BYTES
            self.step(instruction)

    def step(self, ins) -> None:  # noqa: C901 - one dispatch over the subset
        form = self.table.form(ins.form)
        name = form.mnemonic
        ops = ins.operands
        mods = set(ins.modifiers)
        guard = self.pred(ins.guard)
        if name in ("BRA", "EXIT"):
            taken = guard & (self.pred(ops[0]) if len(ops) == 2 else True)
            if taken.any() and not taken.all():
                raise EmulatorError(f"divergent {name} at {self.pc - 16:#x}")
            if taken.all():
                if name == "EXIT":
                    self.exited = True
                else:
                    target = next(o for o in ops if isinstance(o, Target))
                    self.pc += target.offset
            return
        if name == "BPT.TRAP":
            if guard.any():
                raise EmulatorError(f"trap at {self.pc - 16:#x}")
            return
        if name.startswith("BAR"):
            if not guard.all():
                raise EmulatorError("a predicated barrier")
            self.at_barrier = True
            return
        if name in ("NOP", "ACQBULK"):
            return
        if name == "SHFL":
            self._shuffle(ins, ops, guard)
            return
        if name == "VOTE":
            if not guard.all():
                raise EmulatorError("a predicated VOTE (its active lanes are not modelled)")
            held = self.pred(ops[2])
            ballot = int(np.sum(held.astype(np.uint64) << np.arange(WARP, dtype=np.uint64)))
            mode = ins.modifiers[0]
            verdict = {"ALL": held.all(), "ANY": held.any(),
                       "EQ": held.all() or not held.any()}[mode]
            self.write(ops[0], np.full(WARP, ballot, U32), guard)
            self.write_pred(ops[1], np.full(WARP, verdict), guard)
            return
        if name == "S2R":
            special = ops[1].index
            if special == 0x21:
                value = self.tid
            elif special == 0x25:
                value = np.full(WARP, self.ctaid, U32)
            else:
                raise EmulatorError(f"special register {special:#x}")
            self.write(ops[0], value, guard)
            return
        if name == "REDUX":
            if not guard.all():
                raise EmulatorError("a predicated REDUX (its active lanes are not modelled)")
            value = self.reg(ops[1]).astype(np.int64)
            if "S32" in mods:
                value = np.where(value >= 1 << 31, value - (1 << 32), value)
            reduce = {"MAX": np.max, "MIN": np.min, "SUM": np.sum,
                      "AND": np.bitwise_and.reduce, "OR": np.bitwise_or.reduce,
                      "XOR": np.bitwise_xor.reduce}
            operation = next((m for m in ins.modifiers if m in reduce), "AND")
            if ops[0].index != URZ:
                self.ur[ops[0].index] = int(reduce[operation](value)) & MASK32
            return
        if name == "ULDC":
            size = 8 if "64" in mods else 4
            value = self.launch.constant(ops[1].offset, size)
            if guard.any():
                self.ur[ops[0].index] = value & MASK32
                if size == 8:
                    self.ur[ops[0].index + 1] = value >> 32
            return
        if name == "LDC":
            if ops[1].index not in (None, RZ):
                raise EmulatorError("indexed LDC")
            size = 8 if "64" in mods else 4
            value = self.launch.constant(ops[1].offset, size)
            self.write(ops[0], np.full(WARP, value & MASK32), guard)
            if size == 8:
                self.write(Reg(ops[0].index + 1), np.full(WARP, value >> 32), guard)
            return
        if name in ("MOV",):
            self.write(ops[0], self.reg(ops[1]), guard)
            return
        if name == "IADD3":
            total = self.ival(ops[1]) + self.ival(ops[2]) + self.ival(ops[3])
            self.write(ops[0], total, guard)
            return
        if name in ("IMAD", "IMAD.WIDE"):
            a = self.reg(ops[1]).astype(np.uint64)
            b = self.reg(ops[2]).astype(np.uint64)
            if "U32" not in mods:
                raise EmulatorError("signed IMAD is not modelled")
            if name == "IMAD":
                self.write(ops[0], a * b + self.ival(ops[3]), guard)
                return
            c = ops[3]
            if getattr(c, "neg", False):
                raise EmulatorError("negated IMAD.WIDE addend")
            low = self.reg(c).astype(np.uint64)
            high = (np.zeros(WARP, np.uint64) if isinstance(c, Reg) and c.index == RZ
                    else self.reg(_next(c)).astype(np.uint64))
            total = (a * b + (low | (high << np.uint64(32)))) & np.uint64((1 << 64) - 1)
            self.write(ops[0], total & np.uint64(MASK32), guard)
            self.write(Reg(ops[0].index + 1), total >> np.uint64(32), guard)
            return
        if name == "LEA":
            shift = np.uint64(ops[3].value)
            self.write(ops[0], (self.ival(ops[1]) << shift) + self.ival(ops[2]), guard)
            return
        if name == "SHF":
            self.write(ops[0], _funnel(self.reg(ops[1]), self.reg(ops[2]), self.reg(ops[3]),
                                       ins.modifiers), guard)
            return
        if name == "LOP3.LUT":
            a, b, c = (self.reg(o) for o in ops[1:4])
            lut = ops[4].value
            out = np.zeros(WARP, U32)
            for index in range(8):
                if lut >> index & 1:
                    term = np.full(WARP, MASK32, U32)
                    term &= a if index & 4 else ~a
                    term &= b if index & 2 else ~b
                    term &= c if index & 1 else ~c
                    out |= term
            if not self.pred(ops[5]).all():
                raise EmulatorError("LOP3 with a predicate input other than PT")
            self.write(ops[0], out, guard)
            return
        if name in ("SEL", "FSEL"):
            choice = self.pred(ops[3])
            first = self.fval(ops[1]) if name == "FSEL" else self.reg(ops[1])
            second = self.fval(ops[2]) if name == "FSEL" else self.reg(ops[2])
            self.write(ops[0], np.where(choice, first, second), guard)
            return
        if name == "ISETP":
            self._isetp(ins, ops, mods, guard)
            return
        if name == "FSETP":
            a, b = _f(self.fval(ops[2])), _f(self.fval(ops[3]))
            if "FTZ" in mods:
                raise EmulatorError("FSETP.FTZ is not modelled")
            compare = ins.modifiers[0]
            result = _float_compare(compare, a, b)
            self._combine(ops, mods, result, guard, ops[4])
            return
        if name in ("FADD", "FMUL", "FFMA"):
            self._float(name, ops, mods, guard)
            return
        if name == "MUFU":
            self._mufu(ins, ops, guard)
            return
        if name in ("LDG.E", "STG.E"):
            self._global(name, ops, mods, guard)
            return
        if name in ("LDS", "STS"):
            self._shared(name, ops, mods, guard)
            return
        if name.split(".")[0] in ("RED", "REDG") and "ADD" in name and ".64." in name:
            self._reduce_add_u64(ops, guard)
            return
        raise EmulatorError(f"{ins.form} is not modelled")

    def _combine(self, ops, mods, result, guard, psrc) -> None:
        other = self.pred(psrc)
        if "AND" in mods:
            value = result & other
        elif "OR" in mods:
            value = result | other
        else:
            value = result ^ other
        if ops[1].index != PT:
            raise EmulatorError("a second predicate result is not modelled")
        self.write_pred(ops[0], value, guard)

    def _isetp(self, ins, ops, mods, guard) -> None:
        a, b = self.reg(ops[2]), self.reg(ops[3])
        if "U32" in mods:
            a, b = a.astype(np.int64), b.astype(np.int64)
        else:
            a, b = a.view(np.int32).astype(np.int64), b.view(np.int32).astype(np.int64)
        compare = ins.modifiers[0]
        result = {"LT": a < b, "EQ": a == b, "LE": a <= b, "GT": a > b, "NE": a != b,
                  "GE": a >= b}[compare]
        if "EX" in mods:
            # The high words, with the low words' comparison (passed in) deciding a tie.
            low = self.pred(ops[5])
            equal = a == b
            if compare in ("LT", "GT", "LE", "GE"):
                strict = {"LT": a < b, "GT": a > b, "LE": a < b, "GE": a > b}[compare]
                result = strict | (equal & low)
            elif compare == "EQ":
                result = equal & low
            else:
                result = ~equal | low
        self._combine(ops, mods, result, guard, ops[4])

    def _float(self, name, ops, mods, guard) -> None:
        ftz = "FTZ" in mods
        if mods & {"RM", "RP", "RZ", "SAT"}:
            raise EmulatorError(f"{name} with {sorted(mods)} is not modelled")
        sources = [self.fval(o) for o in ops[1:]]
        if ftz:
            sources = [_ftz(s) for s in sources]
        values = [_f(s) for s in sources]
        with np.errstate(all="ignore"):
            if name == "FADD":
                out = values[0] + values[1]
            elif name == "FMUL":
                out = values[0] * values[1]
            else:
                out = fma32(*values)
        bits = _b(out)
        if ftz:
            bits = _ftz(bits)
        self.write(ops[0], bits, guard)

    def _mufu(self, ins, ops, guard) -> None:
        function = ins.modifiers[0]
        with np.errstate(all="ignore"):  # a signalling NaN's widening is "invalid"
            x = _f(_ftz(self.fval(ops[1]))).astype(np.float64)
            if function == "RCP":
                out = (1.0 / x).astype(np.float32)
            elif function == "RSQ":
                out = (1.0 / np.sqrt(x)).astype(np.float32)
            else:
                raise EmulatorError(f"MUFU.{function} is not modelled")
        bits = _ftz(_b(out))
        if self.launch.perturb:
            finite = np.isfinite(out) & (out != 0)
            moved = (bits.astype(np.int64) + self.launch.perturb).astype(U32)
            bits = np.where(finite, moved, bits)
        self.write(ops[0], bits, guard)

    def _shuffle(self, ins, ops, guard) -> None:
        """SHFL over the whole warp (clamp 0x1f, no segments): lane t reads lane src(t),
        its own value where src(t) is outside the warp (the predicate result false)."""
        if not guard.all() or not (self.reg(ops[4]) == 0x1F).all():
            raise EmulatorError("SHFL under a guard or with segments is not modelled")
        value, lane = self.reg(ops[2]), self.reg(ops[3]).astype(np.int64)
        t = np.arange(WARP, dtype=np.int64)
        source = {"IDX": lane & (WARP - 1), "DOWN": t + lane, "UP": t - lane,
                  "BFLY": t ^ lane}[ins.modifiers[0]]
        inside = (source >= 0) & (source < WARP)
        out = np.where(inside, value[np.clip(source, 0, WARP - 1)], value)
        self.write(ops[1], out, guard)
        self.write_pred(ops[0], inside, guard)

    def _size(self, mods) -> int:
        if mods & {"U8", "S8", "U16", "S16"}:
            raise EmulatorError(f"access size {sorted(mods)} is not modelled")
        return 16 if "128" in mods else 8 if "64" in mods else 4

    def _reduce_add_u64(self, ops, guard) -> None:
        """An atomic 64-bit add per lane, lane by lane (lanes may share an address)."""
        address_operand, data = ops
        low = self.r[address_operand.base].astype(np.uint64)
        high = self.r[address_operand.base + 1].astype(np.uint64)
        addresses = (low | (high << np.uint64(32))) + np.uint64(address_operand.offset)
        memory = self.launch.memory
        for lane in np.nonzero(guard)[0]:
            index = int(self.launch.global_index(addresses[lane:lane + 1], 8)[0])
            value = 0 if data.index == RZ else \
                int(self.r[data.index][lane]) | int(self.r[data.index + 1][lane]) << 32
            held = int.from_bytes(memory[index:index + 8].tobytes(), "little")
            total = (held + value) & ((1 << 64) - 1)
            memory[index:index + 8] = np.frombuffer(total.to_bytes(8, "little"), np.uint8)

    def _global(self, name, ops, mods, guard) -> None:
        size = self._size(mods)
        address_operand = ops[1] if name == "LDG.E" else ops[0]
        assert isinstance(address_operand, GMem)
        low = self.r[address_operand.base].astype(np.uint64)
        high = self.r[address_operand.base + 1].astype(np.uint64)
        addresses = (low | (high << np.uint64(32))) + np.uint64(address_operand.offset)
        lanes = np.nonzero(guard)[0]
        if not len(lanes):
            return
        index = self.launch.global_index(addresses[lanes], size)
        memory = self.launch.memory
        words = size // 4
        if name == "LDG.E":
            for w in range(words):
                value = np.zeros(WARP, U32)
                value[lanes] = _read_words(memory, index + 4 * w)
                self.write(Reg(ops[0].index + w), value, guard)
        else:
            for w in range(words):
                _write_words(memory, index + 4 * w, self.r[ops[1].index + w][lanes])

    def _shared(self, name, ops, mods, guard) -> None:
        size = self._size(mods)
        address_operand = ops[1] if name == "LDS" else ops[0]
        assert isinstance(address_operand, SMem)
        if address_operand.ubase is not None or address_operand.x4:
            raise EmulatorError("shared addresses with UR or X4 are not modelled")
        base = (np.zeros(WARP, U32) if address_operand.base == RZ
                else self.r[address_operand.base])
        addresses = base.astype(np.int64) + address_operand.offset
        lanes = np.nonzero(guard)[0]
        if not len(lanes):
            return
        index = addresses[lanes]
        if (index < 0).any() or (index + size > len(self.shared)).any() or (index % size).any():
            raise EmulatorError(f"shared access at {int(index[0]):#x} outside the window")
        words = size // 4
        warp = int(self.tid[0]) // WARP
        if name == "LDS":
            for w in range(words):
                self.launch.races.read(warp, (index + 4 * w) // 4)
                value = np.zeros(WARP, U32)
                value[lanes] = _read_words(self.shared, index + 4 * w)
                self.write(Reg(ops[0].index + w), value, guard)
        else:
            for w in range(words):
                values = self.r[ops[1].index + w][lanes]
                self.launch.races.write(warp, (index + 4 * w) // 4,
                                        _read_words(self.shared, index + 4 * w) == values)
                _write_words(self.shared, index + 4 * w, values)


class SharedRaces:
    """Which warps read and wrote each shared word since the last barrier."""

    def __init__(self, words: int):
        self.writer = np.full(words, -1, np.int64)
        self.readers = np.zeros(words, np.uint64)

    def clear(self) -> None:
        self.writer[:] = -1
        self.readers[:] = 0

    def read(self, warp: int, words: np.ndarray) -> None:
        writer = self.writer[words]
        if ((writer >= 0) & (writer != warp)).any():
            raise EmulatorError(f"shared race: warp {warp} reads a word another warp wrote "
                                f"since the last barrier")
        self.readers[words] |= np.uint64(1 << warp)

    def write(self, warp: int, words: np.ndarray, unchanged: np.ndarray) -> None:
        others = self.readers[words] & ~np.uint64(1 << warp)
        writer = self.writer[words]
        if (others != 0).any() or ((writer >= 0) & (writer != warp) & ~unchanged).any():
            raise EmulatorError(f"shared race: warp {warp} writes a word another warp used "
                                f"since the last barrier")
        self.writer[words] = warp


def _next(operand):
    if isinstance(operand, Reg):
        return Reg(operand.index + 1)
    if isinstance(operand, CBuf):
        return CBuf(operand.bank, operand.offset + 4)
    raise EmulatorError(f"a 64-bit {operand!r}")


def _read_words(memory: np.ndarray, index: np.ndarray) -> np.ndarray:
    out = np.zeros(len(index), U32)
    for byte in range(4):
        out |= memory[index + byte].astype(U32) << U32(8 * byte)
    return out


def _write_words(memory: np.ndarray, index: np.ndarray, values: np.ndarray) -> None:
    # Lanes storing one word at once: hardware keeps one lane's bits, so only equal bits
    # (a flag every voting lane sets) give a defined word.
    unique, first = np.unique(index, return_index=True)
    if len(unique) != len(index):
        values = np.ascontiguousarray(values, U32)
        if (values != values[first[np.searchsorted(unique, index)]]).any():
            raise EmulatorError("two lanes store different bits to one word at once")
        index, values = unique, values[first]
    places = index[:, None] + np.arange(4)
    memory[places] = np.ascontiguousarray(values, U32).view(np.uint8).reshape(-1, 4)


def _funnel(a: np.ndarray, shift: np.ndarray, c: np.ndarray, modifiers) -> np.ndarray:
    direction, kind = modifiers[0], next(m for m in modifiers if m in ("S32", "U32"))
    high = "HI" in modifiers
    if "W" in modifiers:
        raise EmulatorError("SHF.W is not modelled")
    s = np.minimum(shift.astype(np.int64), 32)
    # In Python integers: c << 32 of an unsigned c from 2^31 up does not fit an int64.
    highs = c.view(np.int32) if kind == "S32" else c
    out = np.zeros(WARP, np.int64)
    for lane in range(WARP):
        v, k = int(highs[lane]) << 32 | int(a[lane]), int(s[lane])
        shifted = (v << k) if direction == "L" else (v >> k)
        out[lane] = ((shifted >> 32) if high else shifted) & MASK32
    return out.astype(np.uint64)


def _float_compare(compare: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    nan = np.isnan(a) | np.isnan(b)
    with np.errstate(invalid="ignore"):
        ordered = {"LT": a < b, "EQ": a == b, "LE": a <= b, "GT": a > b,
                   "NE": (a != b) & ~nan, "GE": a >= b}
        if compare in ordered:
            return ordered[compare] & ~nan
        if compare == "NUM":
            return ~nan
        if compare == "NAN":
            return nan
        if compare.endswith("U") and compare[:-1] in ordered:
            return ordered[compare[:-1]] | nan
    raise EmulatorError(f"FSETP.{compare}")


class Arena:
    """Global memory for a test: buffers placed one after another, 256-byte aligned."""

    def __init__(self, base: int = 0x7_0000_0000):
        self.base = base
        self.chunks: list[np.ndarray] = []
        self.addresses: list[int] = []
        self.size = 0

    def put(self, array: np.ndarray) -> int:
        data = np.ascontiguousarray(array).view(np.uint8).reshape(-1).copy()
        address = self.base + self.size
        self.chunks.append(data)
        self.addresses.append(address)
        self.size += -(-max(len(data), 1) // 256) * 256
        return address

    def memory(self) -> np.ndarray:
        memory = np.zeros(self.size, np.uint8)
        for address, data in zip(self.addresses, self.chunks, strict=True):
            memory[address - self.base:address - self.base + len(data)] = data
        return memory

    @staticmethod
    def read(memory: np.ndarray, base: int, address: int, dtype, count: int) -> np.ndarray:
        start = address - base
        return memory[start:start + np.dtype(dtype).itemsize * count].view(dtype).copy()


def constants(parameter_base: int, descriptor_offset: int, block: int, grid: int,
              arguments: list[tuple[str, int]], size: int = 1024) -> bytes:
    """Constant bank 0: blockDim and gridDim as the driver writes them, then the arguments
    ("u64" pointers and "u32" words) from `parameter_base`."""
    data = bytearray(size)
    data[0:12] = np.array([block, 1, 1], U32).tobytes()
    data[12:24] = np.array([grid, 1, 1], U32).tobytes()
    offset = parameter_base
    for kind, value in arguments:
        width = 8 if kind == "u64" else 4
        offset = -(-offset // width) * width
        data[offset:offset + width] = int(value).to_bytes(width, "little")
        offset += width
    return bytes(data)
