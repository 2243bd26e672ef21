"""Pushbuffer words and GPFIFO entries, built only by named, checked builders.

A pushbuffer is a run of 32-bit words: method headers (which method, on which
subchannel, how many data words follow, or an immediate value) and data. A
GPFIFO entry points the channel at a run of pushbuffer words. Every word here
comes from ``pack_word``, which places named fields from the generated tables
and refuses a value that does not fit; nothing else shifts bits.

Formats: method headers are the PBDMA's (NVIDIA's ``clc56f.h``, DMA_INCR_*,
DMA_NONINCR_*, DMA_IMMD_*), the same for every channel class; ``clc86f.h`` in
the vendored release does not restate them. GPFIFO entries and semaphore
methods come from the channel class of the target (``clc56f.h`` on sm_86,
``clc86f.h`` on sm_90).
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from bob.backends.nv import fields_generated as g
from bob.backends.nv.qmd import field_shift
from bob.errors import BadInput

Bits = tuple[int, int]

WORD_BITS = 32
WORD_BYTES = 4
# Host semaphore releases carry 64-bit payloads (PAYLOAD_SIZE_64BIT), as Bob's plans
# ran on the H200: one 8-byte slot per submission (see encoder.py).
SEMAPHORE_BITS = 64
SEMAPHORE_BYTES = 8
# Method headers name a method by its byte offset / 4 (NVIDIA's headers give
# byte offsets: SEND_PCAS_A is 0x02b4, so its header holds 0xad).
METHOD_ADDRESS_SHIFT = 2
# Bob binds its compute class on subchannel 1 (as NVK and tinygrad do) and
# writes host (channel) methods on subchannel 0; the PBDMA executes methods
# below 0x100 itself whatever the subchannel.
COMPUTE_SUBCHANNEL = 1
HOST_SUBCHANNEL = 0
# The copy engine class goes on subchannel 4 of the same channel (as tinygrad binds its
# DMA copy class): methods there reach the channel's copy engine.
COPY_SUBCHANNEL = 4
# A release with a timestamp writes a 16-byte structure: the 64-bit payload, then the
# 64-bit GPU time in nanoseconds (the host's SEM_EXECUTE_RELEASE_TIMESTAMP_EN).
TIMESTAMP_RELEASE_BYTES = 16
# One copy line: LINE_LENGTH_IN is a 32-bit byte count.
COPY_LINE_LIMIT = (1 << WORD_BITS) - 1


class CommandError(BadInput):
    """A pushbuffer word or GPFIFO entry that cannot be encoded (the plan asks for what the
    command stream cannot say); the message says why."""


def pack_word(where: str, table: Mapping[str, Bits], values: Mapping[str, int]) -> int:
    """One 32-bit word from named fields: the only place bits are placed."""
    word = 0
    used = 0
    for name, value in values.items():
        bits = table.get(name)
        if bits is None:
            raise CommandError(f"{where} has no field {name} in the generated table")
        high, low = bits
        width = high - low + 1
        if high >= WORD_BITS:
            raise CommandError(f"{where} field {name} (bits {high}:{low}) is not in one word")
        # type() is int: a bool is refused, as is any other number.
        if type(value) is not int or not 0 <= value < 1 << width:
            raise CommandError(
                f"{where} field {name} (bits {high}:{low}, {width} bits) cannot hold {value!r}"
            )
        mask = ((1 << width) - 1) << low
        if used & mask:
            raise CommandError(f"{where} field {name} overlaps another field of the same word")
        used |= mask
        word |= value << low
    return word


@dataclass(frozen=True)
class ClassTable:
    """One NVIDIA class as Bob uses it: its number, methods, fields and named values."""

    name: str
    number: int
    prefix: str  # the headers' name prefix, e.g. NVC7C0
    methods: Mapping[str, int]
    fields: Mapping[str, Bits]
    values: Mapping[str, int]
    constants: Mapping[str, int] = field(default_factory=dict)

    def method(self, name: str) -> int:
        if name not in self.methods:
            raise CommandError(f"{self.name} has no method {name} in the generated table")
        return self.methods[name]

    def value(self, name: str) -> int:
        if name not in self.values:
            raise CommandError(f"{self.name} has no named value {name} in the generated table")
        return self.values[name]

    def pack(self, values: Mapping[str, int]) -> int:
        return pack_word(self.prefix, self.fields, values)

    def consecutive(self, names: Sequence[str]) -> int:
        """The first of methods that must follow one another word by word."""
        first = self.method(names[0])
        for index, name in enumerate(names):
            if self.method(name) != first + index * WORD_BYTES:
                raise CommandError(f"{self.name} methods {', '.join(names)} are not consecutive")
        return first


AMPERE_COMPUTE_B = ClassTable("AMPERE_COMPUTE_B", g.AMPERE_COMPUTE_B, "NVC7C0",
                              g.NVC7C0_METHODS, g.NVC7C0_FIELDS, g.NVC7C0_VALUES)
HOPPER_COMPUTE_A = ClassTable("HOPPER_COMPUTE_A", g.HOPPER_COMPUTE_A, "NVCBC0",
                              g.NVCBC0_METHODS, g.NVCBC0_FIELDS, g.NVCBC0_VALUES)
AMPERE_CHANNEL_GPFIFO_A = ClassTable("AMPERE_CHANNEL_GPFIFO_A", g.AMPERE_CHANNEL_GPFIFO_A,
                                     "NVC56F", g.NVC56F_METHODS, g.NVC56F_FIELDS,
                                     g.NVC56F_VALUES, g.NVC56F_CONSTANTS)
HOPPER_CHANNEL_GPFIFO_A = ClassTable("HOPPER_CHANNEL_GPFIFO_A", g.HOPPER_CHANNEL_GPFIFO_A,
                                     "NVC86F", g.NVC86F_METHODS, g.NVC86F_FIELDS,
                                     g.NVC86F_VALUES, g.NVC86F_CONSTANTS)
HOPPER_DMA_COPY_A = ClassTable("HOPPER_DMA_COPY_A", g.HOPPER_DMA_COPY_A, "NVC8B5",
                               g.NVC8B5_METHODS, g.NVC8B5_FIELDS, g.NVC8B5_VALUES)
PBDMA = AMPERE_CHANNEL_GPFIFO_A  # the method-header formats every channel shares
SUBCHANNELS = PBDMA.constants["NUMBER_OF_SUBCHANNELS"]


def split_address(table: ClassTable, lower: str, upper: str, address: int,
                  what: str) -> dict[str, int]:
    """An address over a lower word field (in place: bits 31:n hold address bits 31:n)
    and an upper field (address bits 63:32). The lower field's low bit sets the alignment.
    """
    _, low = table.fields[lower]
    if address < 0 or address % (1 << low):
        raise CommandError(f"{what} {address:#x} is not {1 << low}-byte aligned "
                           f"({table.prefix} {lower} holds bits 31:{low})")
    return {lower: (address % (1 << WORD_BITS)) >> low, upper: address >> WORD_BITS}


# -- method headers -----------------------------------------------------------


@dataclass(frozen=True)
class _HeaderFormat:
    """The clc56f.h field names of one method-header form."""

    opcode: str
    opcode_value: str
    third: str  # the count of data words, or the immediate value
    subchannel: str
    address: str


_INCR = _HeaderFormat("DMA_INCR_OPCODE", "DMA_INCR_OPCODE_VALUE", "DMA_INCR_COUNT",
                      "DMA_INCR_SUBCHANNEL", "DMA_INCR_ADDRESS")
_NONINCR = _HeaderFormat("DMA_NONINCR_OPCODE", "DMA_NONINCR_OPCODE_VALUE", "DMA_NONINCR_COUNT",
                         "DMA_NONINCR_SUBCHANNEL", "DMA_NONINCR_ADDRESS")
_IMMD = _HeaderFormat("DMA_IMMD_OPCODE", "DMA_IMMD_OPCODE_VALUE", "DMA_IMMD_DATA",
                      "DMA_IMMD_SUBCHANNEL", "DMA_IMMD_ADDRESS")


@functools.lru_cache(maxsize=4096, typed=True)  # the same few headers, for every segment queued
def _header(form: _HeaderFormat, subchannel: int, method: int, third: int) -> int:
    if isinstance(subchannel, bool) or not 0 <= subchannel < SUBCHANNELS:
        raise CommandError(f"subchannel {subchannel!r} is outside 0..{SUBCHANNELS - 1}")
    if method < 0 or method % WORD_BYTES:
        raise CommandError(f"method {method:#x} is not a {WORD_BYTES}-byte aligned offset")
    return PBDMA.pack({
        form.opcode: PBDMA.value(form.opcode_value),
        form.third: third,
        form.subchannel: subchannel,
        form.address: method >> METHOD_ADDRESS_SHIFT,
    })


def _check_count(count: int) -> None:
    if count < 1:
        raise CommandError(f"a method header needs at least one data word, not {count}")


def incrementing_header(subchannel: int, method: int, count: int) -> int:
    """`count` data words follow, for `method`, `method + 4`, ..."""
    _check_count(count)
    return _header(_INCR, subchannel, method, count)


def non_incrementing_header(subchannel: int, method: int, count: int) -> int:
    """`count` data words follow, all for `method`."""
    _check_count(count)
    return _header(_NONINCR, subchannel, method, count)


def immediate_header(subchannel: int, method: int, value: int) -> int:
    """No data word follows: `value` (13 bits) rides in the header."""
    return _header(_IMMD, subchannel, method, value)


# -- GPFIFO entries -------------------------------------------------------------


def gpfifo_entry(host: ClassTable, address: int, words: int) -> bytes:
    """One GPFIFO entry: fetch `words` pushbuffer words from `address`, unconditionally.

    LEVEL is SUBROUTINE, as tinygrad submits and as Bob's plans ran on the H200
    (docs/RAW-HOPPER.md); every segment Bob writes is self-contained, with no
    call or return, so nothing depends on the main level's fetch state.
    """
    if words < 1:
        raise CommandError(f"a GPFIFO entry must cover at least one word, not {words}")
    get = split_address(host, "GP_ENTRY0_GET", "GP_ENTRY1_GET_HI", address,
                        "GPFIFO pushbuffer address")
    entry0 = host.pack({
        "GP_ENTRY0_FETCH": host.value("GP_ENTRY0_FETCH_UNCONDITIONAL"),
        "GP_ENTRY0_GET": get["GP_ENTRY0_GET"],
    })
    entry1 = host.pack({
        "GP_ENTRY1_GET_HI": get["GP_ENTRY1_GET_HI"],
        "GP_ENTRY1_LEVEL": host.value("GP_ENTRY1_LEVEL_SUBROUTINE"),
        "GP_ENTRY1_LENGTH": words,
        "GP_ENTRY1_SYNC": host.value("GP_ENTRY1_SYNC_PROCEED"),
    })
    data = entry0.to_bytes(WORD_BYTES, "little") + entry1.to_bytes(WORD_BYTES, "little")
    if len(data) != host.constants["GP_ENTRY__SIZE"]:
        raise CommandError(f"{host.name} GPFIFO entries are {host.constants['GP_ENTRY__SIZE']} "
                           "bytes")
    return data


# -- the pushbuffer ---------------------------------------------------------------


class Pushbuffer:
    """32-bit words at consecutive virtual addresses from `base`, below `limit`."""

    def __init__(self, base: int, limit: int):
        if base % WORD_BYTES:
            raise CommandError(f"pushbuffer base {base:#x} is not word aligned")
        self.base = base
        self.limit = limit
        self._words: list[int] = []

    @property
    def address(self) -> int:
        """The virtual address of the next word."""
        return self.base + WORD_BYTES * len(self._words)

    def _append(self, words: Sequence[int]) -> None:
        for word in words:
            if isinstance(word, bool) or not 0 <= word < 1 << WORD_BITS:
                raise CommandError(f"pushbuffer word {word!r} does not fit 32 bits")
        end = self.address + WORD_BYTES * len(words)
        if end > self.limit:
            raise CommandError(
                f"pushbuffer full: {len(words)} more words would end at {end:#x}, past "
                f"{self.limit:#x}"
            )
        self._words.extend(words)

    def incrementing(self, subchannel: int, method: int, data: Sequence[int]) -> None:
        self._append([incrementing_header(subchannel, method, len(data)), *data])

    def immediate(self, subchannel: int, method: int, value: int) -> None:
        self._append([immediate_header(subchannel, method, value)])

    def pad_to(self, address: int) -> None:
        """Zero words up to `address` (never fetched: no GPFIFO entry covers them)."""
        if address < self.address or address % WORD_BYTES:
            raise CommandError(f"cannot pad the pushbuffer back to {address:#x}")
        self._append([0] * ((address - self.address) // WORD_BYTES))

    def to_bytes(self, size: int | None = None) -> bytes:
        data = words_to_bytes(self._words)
        return data if size is None else data.ljust(size, b"\0")


def words_to_bytes(words: Sequence[int]) -> bytes:
    """32-bit words as the pushbuffer holds them, little-endian."""
    return struct.pack(f"<{len(words)}I", *words)


# -- the commands Bob sends ---------------------------------------------------------


class CommandWriter:
    """Named builders for Bob's commands on one channel: a compute class bound on
    `COMPUTE_SUBCHANNEL`, semaphores through the channel (host) class.

    Every method goes in an incrementing packet, the one form Bob's plans ran
    with on the H200 (NVK sends WAIT_FOR_IDLE and SEND_SIGNALING_PCAS2_B as
    immediates, tinygrad as incrementing packets).
    """

    def __init__(self, pushbuffer: Pushbuffer, compute: ClassTable, host: ClassTable):
        self.pushbuffer = pushbuffer
        self.compute = compute
        self.host = host

    def bind_compute(self) -> None:
        """SET_OBJECT: the compute class on the compute subchannel."""
        data = self.compute.pack({"SET_OBJECT_CLASS_ID": self.compute.number,
                                  "SET_OBJECT_ENGINE_ID": 0})
        self.pushbuffer.incrementing(COMPUTE_SUBCHANNEL, self.compute.method("SET_OBJECT"), [data])

    def _window(self, methods: tuple[str, str], fields: tuple[str, str], address: int,
                what: str) -> None:
        """A window base over an A (upper bits) / B (lower 32 bits) method pair."""
        upper, lower = fields
        split = split_address(self.compute, lower, upper, address, what)
        data = [self.compute.pack({upper: split[upper]}),
                self.compute.pack({lower: split[lower]})]
        first = self.compute.consecutive(methods)
        self.pushbuffer.incrementing(COMPUTE_SUBCHANNEL, first, data)

    def shared_memory_window(self, address: int) -> None:
        """Where generic addresses reach shared memory (4 GiB aligned on Hopper)."""
        self._window(
            ("SET_SHADER_SHARED_MEMORY_WINDOW_A", "SET_SHADER_SHARED_MEMORY_WINDOW_B"),
            ("SET_SHADER_SHARED_MEMORY_WINDOW_A_BASE_ADDRESS_UPPER",
             "SET_SHADER_SHARED_MEMORY_WINDOW_B_BASE_ADDRESS"),
            address, "shared memory window",
        )

    def local_memory_window(self, address: int) -> None:
        """Where generic addresses reach local (per-thread) memory."""
        self._window(
            ("SET_SHADER_LOCAL_MEMORY_WINDOW_A", "SET_SHADER_LOCAL_MEMORY_WINDOW_B"),
            ("SET_SHADER_LOCAL_MEMORY_WINDOW_A_BASE_ADDRESS_UPPER",
             "SET_SHADER_LOCAL_MEMORY_WINDOW_B_BASE_ADDRESS"),
            address, "local memory window",
        )

    def wait_for_idle(self) -> None:
        """Let every earlier launch finish before the next starts."""
        value = self.compute.pack({"WAIT_FOR_IDLE_V": 0})
        self.pushbuffer.incrementing(COMPUTE_SUBCHANNEL, self.compute.method("WAIT_FOR_IDLE"),
                                     [value])

    def dispatch(self, qmd_address: int) -> None:
        """SEND_PCAS_A with the QMD's address, then SEND_SIGNALING_PCAS2_B to schedule it."""
        name = "SEND_PCAS_A_QMD_ADDRESS_SHIFTED8"
        shift = field_shift(name)
        if qmd_address < 0 or qmd_address % (1 << shift):
            raise CommandError(f"QMD address {qmd_address:#x} is not {1 << shift}-byte aligned, "
                               f"as {self.compute.prefix}_{name} requires")
        pcas_a = self.compute.pack({name: qmd_address >> shift})
        self.pushbuffer.incrementing(COMPUTE_SUBCHANNEL, self.compute.method("SEND_PCAS_A"),
                                     [pcas_a])
        action = self.compute.value("SEND_SIGNALING_PCAS2_B_PCAS_ACTION_INVALIDATE_COPY_SCHEDULE")
        pcas_b = self.compute.pack({"SEND_SIGNALING_PCAS2_B_PCAS_ACTION": action})
        self.pushbuffer.incrementing(COMPUTE_SUBCHANNEL,
                                     self.compute.method("SEND_SIGNALING_PCAS2_B"), [pcas_b])

    def release_semaphore(self, address: int, payload: int, *, timestamp: bool = False) -> None:
        """Write `payload` (64 bits) at `address` once all earlier work is idle; with
        `timestamp`, the GPU's nanosecond clock follows it (a 16-byte structure)."""
        alignment = TIMESTAMP_RELEASE_BYTES if timestamp else SEMAPHORE_BYTES
        host = self.host
        fields = {
            "SEM_EXECUTE_OPERATION": host.value("SEM_EXECUTE_OPERATION_RELEASE"),
            "SEM_EXECUTE_RELEASE_WFI": host_value(host, "SEM_EXECUTE_RELEASE_WFI",
                                                  "SEM_EXECUTE_RELEASE_WFI_EN"),
        }
        if timestamp:
            fields["SEM_EXECUTE_RELEASE_TIMESTAMP"] = host.value(
                "SEM_EXECUTE_RELEASE_TIMESTAMP_EN")
        self._semaphore(address, payload, fields, alignment,
                        "timestamped 64-bit" if timestamp else "64-bit")

    def acquire_semaphore(self, address: int, payload: int) -> None:
        """Hold the channel until the 64-bit value at `address` reaches `payload` (compared
        circularly, ACQ_CIRC_GEQ, as tinygrad's queues wait): what comes after runs only
        once the work that releases it is done."""
        operation = host_value(self.host, "SEM_EXECUTE_OPERATION",
                               "SEM_EXECUTE_OPERATION_ACQ_CIRC_GEQ")
        self._semaphore(address, payload, {"SEM_EXECUTE_OPERATION": operation},
                        SEMAPHORE_BYTES, "64-bit")

    def _semaphore(self, address: int, payload: int, fields: dict[str, int], alignment: int,
                   what: str) -> None:
        """SEM_ADDR_LO .. SEM_EXECUTE in one packet: the address, the 64-bit payload, and
        SEM_EXECUTE with `fields` and a 64-bit payload size."""
        _check_payload(payload)
        if address % alignment:
            raise CommandError(f"a {what} semaphore at {address:#x} is not "
                               f"{alignment}-byte aligned")
        host = self.host
        split = split_address(host, "SEM_ADDR_LO_OFFSET", "SEM_ADDR_HI_OFFSET", address,
                              "semaphore address")
        execute = host.pack({**fields, "SEM_EXECUTE_PAYLOAD_SIZE": host_value(
            host, "SEM_EXECUTE_PAYLOAD_SIZE", "SEM_EXECUTE_PAYLOAD_SIZE_64BIT")})
        data = [
            host.pack({"SEM_ADDR_LO_OFFSET": split["SEM_ADDR_LO_OFFSET"]}),
            host.pack({"SEM_ADDR_HI_OFFSET": split["SEM_ADDR_HI_OFFSET"]}),
            payload % (1 << WORD_BITS),  # SEM_PAYLOAD_LO: the whole word, payload bits 31:0
            payload >> WORD_BITS,  # SEM_PAYLOAD_HI: payload bits 63:32
            execute,
        ]
        first = host.consecutive(["SEM_ADDR_LO", "SEM_ADDR_HI", "SEM_PAYLOAD_LO",
                                  "SEM_PAYLOAD_HI", "SEM_EXECUTE"])
        self.pushbuffer.incrementing(HOST_SUBCHANNEL, first, data)


def _check_payload(payload: int) -> None:
    if isinstance(payload, bool) or not isinstance(payload, int) or \
            not 0 <= payload < 1 << SEMAPHORE_BITS:
        raise CommandError(f"semaphore payload {payload!r} does not fit 64 bits")


class CopyWriter:
    """Named builders for the copy engine (HOPPER_DMA_COPY_A) on `COPY_SUBCHANNEL`.

    A copy is one pitch-linear line of virtual memory to virtual memory
    (OFFSET_IN/OUT, LINE_LENGTH_IN, then LAUNCH_DMA, non-pipelined so that it
    starts after the copy before it). The last copy of a batch flushes its
    writes and then releases a 64-bit semaphore (two-word payload): when the
    CPU sees the value, every byte of the batch is in memory.
    """

    def __init__(self, pushbuffer: Pushbuffer, copy: ClassTable = HOPPER_DMA_COPY_A):
        self.pushbuffer = pushbuffer
        self.copy_class = copy

    def bind(self) -> None:
        """SET_OBJECT: the copy class on the copy subchannel (a PBDMA method, any class)."""
        data = PBDMA.pack({"SET_OBJECT_NVCLASS": self.copy_class.number})
        self.pushbuffer.incrementing(COPY_SUBCHANNEL, PBDMA.method("SET_OBJECT"), [data])

    def _address_pair(self, upper: str, lower: str, address: int, what: str) -> list[int]:
        ce = self.copy_class
        high_bits = ce.fields[f"{upper}_UPPER"][0] + 1 + WORD_BITS
        if isinstance(address, bool) or not 0 <= address < 1 << high_bits:
            raise CommandError(f"{what} {address!r} is not a {high_bits}-bit GPU address")
        return [ce.pack({f"{upper}_UPPER": address >> WORD_BITS}),
                ce.pack({f"{lower}_VALUE": address % (1 << WORD_BITS)})]

    def copy(self, source: int, destination: int, size: int, *,
             release: tuple[int, int] | None = None) -> None:
        """Copy `size` bytes from GPU address `source` to `destination`; with `release`
        (address, payload), flush and release the semaphore when the copy is done."""
        ce = self.copy_class
        if isinstance(size, bool) or not 0 < size <= COPY_LINE_LIMIT:
            raise CommandError(f"a copy line is 1 to {COPY_LINE_LIMIT} bytes, not {size!r}")
        offsets = (self._address_pair("OFFSET_IN_UPPER", "OFFSET_IN_LOWER", source, "source")
                   + self._address_pair("OFFSET_OUT_UPPER", "OFFSET_OUT_LOWER", destination,
                                        "destination"))
        first = ce.consecutive(["OFFSET_IN_UPPER", "OFFSET_IN_LOWER", "OFFSET_OUT_UPPER",
                                "OFFSET_OUT_LOWER"])
        chosen = {"DATA_TRANSFER_TYPE": "NON_PIPELINED", "SRC_MEMORY_LAYOUT": "PITCH",
                  "DST_MEMORY_LAYOUT": "PITCH", "MULTI_LINE_ENABLE": "FALSE",
                  "SRC_TYPE": "VIRTUAL", "DST_TYPE": "VIRTUAL"}
        semaphore: list[int] = []
        if release is not None:  # checked before any word is written
            semaphore = self._semaphore(*release)
            chosen.update({"FLUSH_ENABLE": "TRUE", "FLUSH_TYPE": "SYS",
                           "SEMAPHORE_TYPE": "RELEASE_ONE_WORD_SEMAPHORE",
                           "SEMAPHORE_PAYLOAD_SIZE": "TWO_WORD"})
        launch = ce.pack({f"LAUNCH_DMA_{name}": ce.value(f"LAUNCH_DMA_{name}_{value}")
                          for name, value in chosen.items()})
        self.pushbuffer.incrementing(COPY_SUBCHANNEL, first, offsets)
        self.pushbuffer.incrementing(COPY_SUBCHANNEL, ce.method("LINE_LENGTH_IN"),
                                     [ce.pack({"LINE_LENGTH_IN_VALUE": size})])
        if semaphore:
            self.pushbuffer.incrementing(COPY_SUBCHANNEL, ce.consecutive(
                ["SET_SEMAPHORE_A", "SET_SEMAPHORE_B", "SET_SEMAPHORE_PAYLOAD",
                 "SET_SEMAPHORE_PAYLOAD_UPPER"]), semaphore)
        self.pushbuffer.incrementing(COPY_SUBCHANNEL, ce.method("LAUNCH_DMA"), [launch])

    def _semaphore(self, address: int, payload: int) -> list[int]:
        """SET_SEMAPHORE_A, _B, _PAYLOAD, _PAYLOAD_UPPER: a 64-bit payload at `address`."""
        ce = self.copy_class
        _check_payload(payload)
        if address % SEMAPHORE_BYTES:
            raise CommandError(f"a 64-bit semaphore at {address:#x} is not "
                               f"{SEMAPHORE_BYTES}-byte aligned")
        high_bits = ce.fields["SET_SEMAPHORE_A_UPPER"][0] + 1 + WORD_BITS
        if not 0 <= address < 1 << high_bits:
            raise CommandError(f"semaphore address {address:#x} is not a {high_bits}-bit "
                               "GPU address")
        return [ce.pack({"SET_SEMAPHORE_A_UPPER": address >> WORD_BITS}),
                ce.pack({"SET_SEMAPHORE_B_LOWER": address % (1 << WORD_BITS)}),
                ce.pack({"SET_SEMAPHORE_PAYLOAD_PAYLOAD": payload % (1 << WORD_BITS)}),
                ce.pack({"SET_SEMAPHORE_PAYLOAD_UPPER_PAYLOAD": payload >> WORD_BITS})]


def host_value(host: ClassTable, field_name: str, value_name: str) -> int:
    """A named value of a channel-class field, with one documented fallback.

    clc86f.h (HOPPER_CHANNEL_GPFIFO_A, vendored release) defines
    SEM_EXECUTE_RELEASE_WFI (20:20) with only its _DIS value and
    SEM_EXECUTE_PAYLOAD_SIZE (24:24) with only _32BIT; the other values are
    clc56f.h's SEM_EXECUTE_RELEASE_WFI_EN and SEM_EXECUTE_PAYLOAD_SIZE_64BIT for
    the very same fields. The fallback is taken only when both classes place the
    field identically.
    """
    if value_name in host.values:
        return host.values[value_name]
    if host.fields.get(field_name) != PBDMA.fields.get(field_name):
        raise CommandError(f"{host.name} has no value {value_name} and its {field_name} "
                           f"differs from {PBDMA.name}'s")
    return PBDMA.value(value_name)
