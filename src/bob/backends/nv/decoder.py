"""An independent decoder and printer for Bob's NVIDIA command streams.

    print(disassemble(encode(plan), plan))   # bob plan --arch sm_90 --disasm

Its tables do not come from the generated module the encoder uses: at import
time it parses the vendored headers itself, with its own reader, and keeps
everything in them (every QMD field of both versions, every method and field
of the class excerpts), so a wrong bit in the generator or the encoder shows
up as a wrong value here, and a stray bit as an unexplained one.

What it derives, and how:

- classes from the class-number defines (``AMPERE_COMPUTE_B 0xC7C0`` names
  the ``NVC7C0_`` defines); methods are the numeric defines that are neither a
  field's named value nor one of the word-format families (DMA_*, GP_ENTRY*);
- QMD layouts from ``NVxxxx_QMDVaa_bb_`` defines; an indexed field ``X(i)`` has
  as many instances as fit before the next field (see ``_instance_counts``);
- shifts from field names (``..._SHIFTED6`` holds the value >> 6) and, for
  method headers, from the header's own two address formats (the byte offset
  at DMA_METHOD_ADDRESS_OLD 12:2, the word offset at DMA_METHOD_ADDRESS 11:0).

The facts it is told: which QMD version a compute class reads
(``QMD_VERSION_OF_CLASS``), as Mesa NVK does, and that a dependent QMD
pointer names a QMD as SEND_PCAS_A does, by its address >> 8 (the shift is
read from the method's own field name, ``QMD_ADDRESS_SHIFTED8``).

A chained submission's later launches are not in the pushbuffer: each QMD
names the next (``Dispatch.dependents``). ``follow_chain`` walks such a chain
and refuses, in one line, a pointer that is not at a QMD of the table or a
chain that comes back on itself.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from bob.errors import RunFailure
from bob.plan.model import Plan, PointerParam
from bob.plan.placement import argument_slots

if TYPE_CHECKING:
    from bob.backends.nv.encoder import EncodedProgram

HEADERS = Path(__file__).with_name("headers")
QMD_VERSION_OF_CLASS = {0xC7C0: "03_00", 0xCBC0: "04_00"}  # AMPERE_COMPUTE_B, HOPPER_COMPUTE_A
HOST_METHOD_LIMIT = 0x100  # methods below run in the channel (host) whatever the subchannel
WORD_BITS = 32

_DEFINE = re.compile(r"^\s*#\s*define\s+(\w+?)(\(i\))?\s+(.+?)\s*(?://.*)?$")
_RANGE = re.compile(r"^(?:MW\()?(\d+):(\d+)\)?$")
_INDEXED = re.compile(r"^MW\(\((\d+)\+\(i\)\*(\d+)\):\((\d+)\+\(i\)\*(\d+)\)\)$")
_NUMBER = re.compile(r"^\(?(0[xX][0-9a-fA-F]+|\d+)\)?$")
_QMD_NAME = re.compile(r"^NV[0-9A-F]{4}_QMDV(\d\d_\d\d)_(\w+)$")
_SHIFT = re.compile(r"_SHIFTED(\d+)(?:\(\d+\))?$")
_NOT_METHODS = ("DMA_", "GP_ENTRY", "NUMBER_OF_")


class DecodeError(RunFailure):
    """Bytes that do not decode as Bob's command stream; the message says where."""


@dataclass(frozen=True)
class Field:
    name: str
    high: int
    low: int

    @property
    def width(self) -> int:
        return self.high - self.low + 1

    @property
    def mask(self) -> int:
        return ((1 << self.width) - 1) << self.low

    def extract(self, value: int) -> int:
        return (value & self.mask) >> self.low

    @property
    def shift(self) -> int:
        match = _SHIFT.search(self.name)
        return int(match.group(1)) if match else 0


@dataclass
class ClassInfo:
    """One class as its header describes it (all of it, not only what Bob uses)."""

    number: int
    name: str
    prefix: str
    fields: dict[str, Field] = field(default_factory=dict)
    numbers: dict[str, int] = field(default_factory=dict)
    methods: dict[int, str] = field(default_factory=dict)
    value_names: dict[str, dict[int, str]] = field(default_factory=dict)

    def method_fields(self, method: str) -> list[Field]:
        """The fields of a method's data word (not those of a longer method's name)."""
        others = [m for m in self.methods.values() if m != method and m.startswith(method)]
        return [
            f for f in self.fields.values()
            if f.name.startswith(method + "_")
            and not any(f.name.startswith(o + "_") for o in others)
        ]


@dataclass
class QmdLayout:
    version: str  # "03_00"
    fields: dict[str, Field] = field(default_factory=dict)  # indexed ones as "X(0)", "X(1)"...
    families: dict[str, list[Field]] = field(default_factory=dict)  # "X" -> its instances
    value_names: dict[str, dict[int, str]] = field(default_factory=dict)  # by family/field
    record_bytes: int = 0

    def field(self, name: str) -> Field:
        if name not in self.fields:
            raise DecodeError(f"QMD V{self.version} has no field {name}")
        return self.fields[name]


def _value_owner(name: str, fields: Sequence[str]) -> str | None:
    """The longest field name `name` extends (`FIELD_VALUE`), if any."""
    owners = [f for f in fields if name.startswith(f + "_")]
    return max(owners, key=len) if owners else None


def _read_header(path: Path) -> Iterator[tuple[str, bool, str]]:
    for line in path.read_text().splitlines():
        match = _DEFINE.match(line)
        if match:
            yield match.group(1), bool(match.group(2)), match.group(3)


class HeaderTables:
    """Everything the vendored headers say, parsed by the decoder's own reader."""

    def __init__(self, directory: Path):
        self.classes: dict[int, ClassInfo] = {}
        self.qmd: dict[str, QmdLayout] = {}
        defines = [d for path in sorted(directory.glob("*.h")) for d in _read_header(path)]
        self._read_classes(defines)
        self._read_qmds(defines)
        pbdma = [c for c in self.classes.values() if "DMA_METHOD_ADDRESS" in c.fields]
        if not pbdma:
            raise DecodeError("no vendored header defines the pushbuffer method format")
        self.pbdma = pbdma[0]

    def _read_classes(self, defines: list[tuple[str, bool, str]]) -> None:
        for name, indexed, value in defines:
            number = _NUMBER.match(value)
            if not name.startswith("NV") and not indexed and number:
                klass = int(number.group(1), 0)
                prefix = f"NV{klass:04X}_"
                self.classes[klass] = ClassInfo(klass, name, prefix)
        by_prefix = {c.prefix: c for c in self.classes.values()}
        for name, indexed, value in defines:
            info = by_prefix.get(name[:7])
            if info is None or _QMD_NAME.match(name) or indexed:
                continue
            short = name[len(info.prefix):]
            bits = _RANGE.match(value)
            number = _NUMBER.match(value)
            if bits:
                info.fields[short] = Field(short, int(bits.group(1)), int(bits.group(2)))
            elif number:
                info.numbers[short] = int(number.group(1), 0)
        for info in self.classes.values():
            names = list(info.fields)
            for short, number in info.numbers.items():
                owner = _value_owner(short, names)
                if owner is not None:
                    info.value_names.setdefault(owner, {})[number] = short[len(owner) + 1:]
                elif not short.startswith(_NOT_METHODS) and "__" not in short:
                    info.methods[number] = short

    def _read_qmds(self, defines: list[tuple[str, bool, str]]) -> None:
        families: dict[str, dict[str, tuple[int, int, int]]] = {}
        numbers: dict[str, dict[str, int]] = {}
        for name, indexed, value in defines:
            match = _QMD_NAME.match(name)
            if not match:
                continue
            version, short = match.groups()
            layout = self.qmd.setdefault(version, QmdLayout(version))
            bits = _RANGE.match(value)
            spread = _INDEXED.match(value)
            number = _NUMBER.match(value)
            if indexed and spread:
                high, high_stride, low, low_stride = (int(x) for x in spread.groups())
                if high_stride != low_stride:
                    raise DecodeError(f"{name}(i): its two bounds move by different strides")
                families.setdefault(version, {})[short] = (high, low, high_stride)
            elif bits:
                layout.fields[short] = Field(short, int(bits.group(1)), int(bits.group(2)))
            elif number:
                numbers.setdefault(version, {})[short] = int(number.group(1), 0)
        for version, layout in self.qmd.items():
            top = max(f.high for f in layout.fields.values())
            layout.record_bytes = (top // 32 + 1) * 4
            spreads = families.get(version, {})
            for family, count in _instance_counts(layout, spreads).items():
                high, low, stride = spreads[family]
                instances = [Field(f"{family}({i})", high + i * stride, low + i * stride)
                             for i in range(count)]
                layout.families[family] = instances
                layout.fields.update((f.name, f) for f in instances)
            owners = [n for n in layout.fields if "(" not in n] + list(spreads)
            for short, number in numbers.get(version, {}).items():
                owner = _value_owner(short, owners)
                if owner is not None:
                    layout.value_names.setdefault(owner, {})[number] = short[len(owner) + 1:]


def _instance_counts(layout: QmdLayout, spreads: dict[str, tuple[int, int, int]]
                     ) -> dict[str, int]:
    """How many instances each indexed QMD field has.

    Instance i of a family lies `stride * i` bits after instance 0. A family
    continues while its next instance stays inside the record and clear of
    every plain field and of instance 0 of every other family; families with
    the same stride describe one array of structures, so they share the
    smallest count (eight constant buffers, three releases, two dependent QMDs).
    """
    bits = layout.record_bytes * 8

    def mask(high: int, low: int) -> int:
        return ((1 << (high - low + 1)) - 1) << low

    plain = 0
    for f in layout.fields.values():
        plain |= f.mask
    firsts = {name: mask(high, low) for name, (high, low, _) in spreads.items()}
    counts: dict[str, int] = {}
    for name, (high, low, stride) in spreads.items():
        others = plain
        for other, first in firsts.items():
            if other != name:
                others |= first
        count = 1
        while high + count * stride < bits and not (
            mask(high + count * stride, low + count * stride) & others
        ):
            count += 1
        counts[name] = count
    by_stride: dict[int, int] = {}
    for name, (_, _, stride) in spreads.items():
        by_stride[stride] = min(by_stride.get(stride, counts[name]), counts[name])
    return {name: by_stride[stride] for name, (_, _, stride) in spreads.items()}


TABLES = HeaderTables(HEADERS)


# -- GPFIFO entries --------------------------------------------------------------------


@dataclass(frozen=True)
class GpEntry:
    index: int
    address: int
    words: int
    fetch: str
    level: str
    sync: str


def _class(number: int) -> ClassInfo:
    if number not in TABLES.classes:
        raise DecodeError(f"class {number:#x} is not in the vendored headers")
    return TABLES.classes[number]


def _name_of(info: ClassInfo, field_name: str, value: int) -> str:
    return info.value_names.get(field_name, {}).get(value, str(value))


def decode_gpfifo(data: bytes, host_class: int) -> list[GpEntry]:
    host = _class(host_class)
    size = host.numbers["GP_ENTRY__SIZE"]
    if len(data) % size:
        raise DecodeError(f"GPFIFO of {len(data)} bytes is not a whole number of {size}-byte "
                          "entries")
    entries = []
    f = host.fields
    for index in range(len(data) // size):
        entry0, entry1 = struct.unpack_from("<II", data, index * size)
        # GP_ENTRY0_GET holds address bits 31:2 in place; GET_HI holds bits 39:32.
        address = (entry0 & f["GP_ENTRY0_GET"].mask
                   | f["GP_ENTRY1_GET_HI"].extract(entry1) << WORD_BITS)
        entries.append(GpEntry(
            index=index,
            address=address,
            words=f["GP_ENTRY1_LENGTH"].extract(entry1),
            fetch=_name_of(host, "GP_ENTRY0_FETCH", f["GP_ENTRY0_FETCH"].extract(entry0)),
            level=_name_of(host, "GP_ENTRY1_LEVEL", f["GP_ENTRY1_LEVEL"].extract(entry1)),
            sync=_name_of(host, "GP_ENTRY1_SYNC", f["GP_ENTRY1_SYNC"].extract(entry1)),
        ))
    return entries


# -- pushbuffer methods ----------------------------------------------------------------


@dataclass(frozen=True)
class DecodedField:
    name: str  # relative to its method: OPERATION for SEM_EXECUTE_OPERATION
    field: Field
    value: int
    value_name: str | None

    @property
    def in_place(self) -> int:
        """The value at its bit position (an OFFSET 31:2 field gives address bits 31:2)."""
        return self.value << self.field.low

    @property
    def unshifted(self) -> int:
        """The value a ``_SHIFTEDn`` field stands for."""
        return self.value << self.field.shift


@dataclass(frozen=True)
class MethodCall:
    address: int  # the virtual address of the word carrying the data (immediate: the header)
    form: str
    subchannel: int
    method: int
    data: int
    class_name: str
    name: str  # relative to its class; "0x...": a method the headers do not name
    fields: tuple[DecodedField, ...]

    def field(self, name: str) -> DecodedField:
        for decoded in self.fields:
            if decoded.name == name:
                return decoded
        raise DecodeError(f"{self.class_name} {self.name} at {self.address:#x} has no field "
                          f"{name}")

    def describe(self) -> str:
        method = f"{self.class_name}.{self.name}"
        parts = [f"{self.address:#014x}  sc{self.subchannel} {method:<58} = {self.data:#010x}"
                 f"  ({self.form})"]
        for decoded in self.fields:
            shown = decoded.value_name or f"{decoded.value:#x}"
            parts.append(f"{decoded.name}={shown}")
        return "  ".join(parts)


_FORMS = {
    "INC_METHOD": "incrementing",
    "NON_INC_METHOD": "non-incrementing",
    "IMMD_DATA_METHOD": "immediate",
    "ONE_INC": "increment-once",
}


def _method_call(address: int, form: str, subchannel: int, method: int, data: int,
                 host: ClassInfo, bindings: dict[int, int]) -> MethodCall:
    if method < HOST_METHOD_LIMIT:
        info = host
    elif subchannel in bindings:
        info = _class(bindings[subchannel])
    else:
        raise DecodeError(f"{address:#x}: method {method:#x} on subchannel {subchannel}, which "
                          "has no class bound (SET_OBJECT)")
    name = info.methods.get(method, f"{method:#x}")
    fields = []
    for f in info.method_fields(name):
        value = f.extract(data)
        fields.append(DecodedField(f.name[len(name) + 1:], f, value, _value_label(info, f, value)))
    if method == 0:  # SET_OBJECT binds a class to the subchannel
        nvclass = host.fields.get("SET_OBJECT_NVCLASS") or TABLES.pbdma.fields["SET_OBJECT_NVCLASS"]
        number = nvclass.extract(data)
        bindings[subchannel] = number
        label = TABLES.classes[number].name if number in TABLES.classes else None
        fields = [DecodedField("NVCLASS", nvclass, number, label)]
    return MethodCall(address, form, subchannel, method, data, info.name, name, tuple(fields))


def _value_label(info: ClassInfo, f: Field, value: int) -> str | None:
    """A field value's name in its class's header.

    A channel class may leave a value of a host field unnamed where the PBDMA's
    header names it (clc86f.h has SEM_EXECUTE_PAYLOAD_SIZE_32BIT but not _64BIT,
    RELEASE_WFI_DIS but not _EN); the PBDMA's name is used when its header places
    the field at the very same bits.
    """
    label = info.value_names.get(f.name, {}).get(value)
    pbdma = TABLES.pbdma
    if label is None and info is not pbdma and f.name.startswith("SEM_"):
        same = pbdma.fields.get(f.name)
        if same is not None and (same.high, same.low) == (f.high, f.low):
            label = pbdma.value_names.get(f.name, {}).get(value)
    return label


def decode_segment(words: Sequence[int], address: int, host_class: int,
                   bindings: dict[int, int]) -> list[MethodCall]:
    """The method calls of one pushbuffer segment; `bindings` (subchannel -> class) is
    updated by SET_OBJECT and carries over from segment to segment, as in a channel.
    """
    host = _class(host_class)
    pb = TABLES.pbdma.fields
    forms = {number: _FORMS[name] for number, name in
             TABLES.pbdma.value_names["DMA_SEC_OP"].items() if name in _FORMS}
    # DMA_METHOD_ADDRESS (11:0) holds the method's offset / 4; the older format
    # DMA_METHOD_ADDRESS_OLD (12:2) held the byte offset in place: the difference
    # of their low bits is the shift.
    address_shift = pb["DMA_METHOD_ADDRESS_OLD"].low - pb["DMA_METHOD_ADDRESS"].low
    calls: list[MethodCall] = []
    position = 0
    while position < len(words):
        header_address = address + 4 * position
        header = words[position]
        opcode = pb["DMA_SEC_OP"].extract(header)
        if opcode not in forms:
            raise DecodeError(f"{header_address:#x}: header {header:#010x} has opcode {opcode} "
                              "(not a method form Bob writes)")
        form = forms[opcode]
        subchannel = pb["DMA_METHOD_SUBCHANNEL"].extract(header)
        method = pb["DMA_METHOD_ADDRESS"].extract(header) << address_shift
        if form == "immediate":
            data = pb["DMA_IMMD_DATA"].extract(header)
            calls.append(_method_call(header_address, form, subchannel, method, data, host,
                                      bindings))
            position += 1
            continue
        count = pb["DMA_METHOD_COUNT"].extract(header)
        if count == 0 or position + count >= len(words):
            raise DecodeError(f"{header_address:#x}: header {header:#010x} announces {count} "
                              f"data words; the segment has {len(words) - position - 1} left")
        for k in range(count):
            step = {"incrementing": k, "non-incrementing": 0, "increment-once": min(k, 1)}[form]
            calls.append(_method_call(header_address + 4 * (1 + k), form, subchannel,
                                      method + 4 * step, words[position + 1 + k], host,
                                      bindings))
        position += 1 + count
    return calls


# -- QMDs --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Release:
    address: int
    payload: int
    structure: str  # the header's name for the structure size, e.g. SEMAPHORE_ONE_WORD


@dataclass(frozen=True)
class Dependent:
    """A QMD this one hands to the compute engine when its grid completes."""

    address: int
    action: str  # the header's name for the action, e.g. QMD_SCHEDULE
    prefetch: bool


@dataclass(frozen=True)
class Dispatch:
    """What a QMD asks the compute engine to do."""

    major_version: int
    program_address: int
    grid: tuple[int, int, int]  # in CTAs (a grid of clusters: its GRID_* times the cluster)
    block: tuple[int, int, int]
    registers: int
    barriers: int
    shared_memory: int
    constant_buffers: dict[int, tuple[int, int]]  # valid banks: index -> (address, size)
    releases: tuple[Release, ...]
    dependents: tuple[Dependent, ...] = ()
    arrive_latch: int | None = None  # the latch the grid arrives at when it completes
    wait_latch: int | None = None  # the latch the grid waits on before it runs
    program_pre_exit: bool = False  # CTAs may schedule the dependent as they exit
    cluster: tuple[int, int, int] | None = None  # a grid of clusters (GRID_GPC_CGA): their CTAs


@dataclass(frozen=True)
class _ReleaseNames:
    enable: str
    address: tuple[str, str]
    payload: tuple[str, str]
    payload64: str
    structure: str


@dataclass(frozen=True)
class _DependentNames:
    enable: str
    action: str
    prefetch: str
    pointer: str


@dataclass(frozen=True)
class _Schema:
    """Which fields of a QMD version carry a dispatch (the versions rename them)."""

    grid: tuple[str, str, str]
    registers: str
    cbuf_address: tuple[str, str]
    releases: tuple[_ReleaseNames, ...]
    dependents: tuple[_DependentNames, ...]
    program: tuple[str, str] = ("PROGRAM_ADDRESS_LOWER", "PROGRAM_ADDRESS_UPPER")
    cbuf_valid: str = "CONSTANT_BUFFER_VALID"  # families
    cbuf_size: str = "CONSTANT_BUFFER_SIZE_SHIFTED4"
    block: tuple[str, str, str] = ("CTA_THREAD_DIMENSION0", "CTA_THREAD_DIMENSION1",
                                   "CTA_THREAD_DIMENSION2")


_SCHEMA_VERSIONS = ("03_00", "04_00")
_RELEASES = 3
_DEPENDENTS = 2
# The fields the versions name differently, side by side: what each holds, then its name
# in V03_00 and in V04_00; {i} stands for the index of a release or a dependent QMD.
_RENAMED_FIELDS = {
    "grid width": ("CTA_RASTER_WIDTH", "GRID_WIDTH"),
    "grid height": ("CTA_RASTER_HEIGHT", "GRID_HEIGHT"),
    "grid depth": ("CTA_RASTER_DEPTH", "GRID_DEPTH"),
    "registers": ("REGISTER_COUNT_V", "REGISTER_COUNT"),
    "cbuf address lower": ("CONSTANT_BUFFER_ADDR_LOWER", "CONSTANT_BUFFER_ADDR_LOWER_SHIFTED6"),
    "cbuf address upper": ("CONSTANT_BUFFER_ADDR_UPPER", "CONSTANT_BUFFER_ADDR_UPPER_SHIFTED6"),
    "release enable": ("RELEASE{i}_ENABLE", "RELEASE_ENABLE({i})"),
    "release address lower": ("RELEASE{i}_ADDRESS_LOWER", "RELEASE_SEMAPHORE{i}_ADDR_LOWER"),
    "release address upper": ("RELEASE{i}_ADDRESS_UPPER", "RELEASE_SEMAPHORE{i}_ADDR_UPPER"),
    "release payload lower": ("RELEASE{i}_PAYLOAD_LOWER", "RELEASE_SEMAPHORE{i}_PAYLOAD_LOWER"),
    "release payload upper": ("RELEASE{i}_PAYLOAD_UPPER", "RELEASE_SEMAPHORE{i}_PAYLOAD_UPPER"),
    "release payload64": ("RELEASE{i}_PAYLOAD64B", "RELEASE_PAYLOAD64B({i})"),
    "release structure": ("RELEASE{i}_STRUCTURE_SIZE", "RELEASE_STRUCTURE_SIZE({i})"),
    "dependent enable": ("DEPENDENT_QMD{i}_ENABLE", "DEPENDENT_QMD_ENABLE({i})"),
    "dependent action": ("DEPENDENT_QMD{i}_ACTION", "DEPENDENT_QMD_ACTION({i})"),
    "dependent prefetch": ("DEPENDENT_QMD{i}_PREFETCH", "DEPENDENT_QMD_PREFETCH({i})"),
    "dependent pointer": ("DEPENDENT_QMD{i}_POINTER", "DEPENDENT_QMD{i}_POINTER"),
}


def _schema(version: str) -> _Schema:
    """One version's column of the renamed fields."""
    column = _SCHEMA_VERSIONS.index(version)

    def name(role: str, index: int = 0) -> str:
        return _RENAMED_FIELDS[role][column].format(i=index)

    return _Schema(
        grid=(name("grid width"), name("grid height"), name("grid depth")),
        registers=name("registers"),
        cbuf_address=(name("cbuf address lower"), name("cbuf address upper")),
        releases=tuple(
            _ReleaseNames(name("release enable", i),
                          (name("release address lower", i), name("release address upper", i)),
                          (name("release payload lower", i), name("release payload upper", i)),
                          name("release payload64", i), name("release structure", i))
            for i in range(_RELEASES)),
        dependents=tuple(
            _DependentNames(name("dependent enable", i), name("dependent action", i),
                            name("dependent prefetch", i), name("dependent pointer", i))
            for i in range(_DEPENDENTS)),
    )


_SCHEMAS = {version: _schema(version) for version in _SCHEMA_VERSIONS}


class DecodedQmd:
    """One QMD record read through the decoder's own layout."""

    def __init__(self, record: bytes, compute_class: int):
        if compute_class not in QMD_VERSION_OF_CLASS:
            raise DecodeError(f"no QMD version known for compute class {compute_class:#x}")
        self.version = QMD_VERSION_OF_CLASS[compute_class]
        self.layout = TABLES.qmd[self.version]
        if len(record) != self.layout.record_bytes:
            raise DecodeError(f"QMD V{self.version} is {self.layout.record_bytes} bytes, not "
                              f"{len(record)}")
        self.bits = int.from_bytes(record, "little")

    def get(self, name: str) -> int:
        return self.layout.field(name).extract(self.bits)

    def value_name(self, name: str, value: int) -> str | None:
        family = name.partition("(")[0]
        return self.layout.value_names.get(family, {}).get(value)

    def nonzero(self) -> list[tuple[Field, int]]:
        """Every field with a nonzero value, by position (aliases included)."""
        found = [(f, f.extract(self.bits)) for f in self.layout.fields.values()]
        return sorted(((f, v) for f, v in found if v), key=lambda item: (item[0].low, item[0].name))

    def unexplained(self) -> int:
        """Set bits that no field of the layout covers."""
        covered = 0
        for f in self.layout.fields.values():
            covered |= f.mask
        return self.bits & ~covered

    def _join(self, lower: str, upper: str) -> int:
        low = self.layout.field(lower)
        return (self.get(lower) | self.get(upper) << low.width) << low.shift

    def qmd_type(self) -> str | None:
        """The header's name for the QMD's type (V04 on); None where the version has none."""
        if "QMD_TYPE" not in self.layout.fields:
            return None
        value = self.get("QMD_TYPE")
        return self.value_name("QMD_TYPE", value) or str(value)

    def _cluster(self) -> tuple[int, int, int] | None:
        """The CTAs of a cluster of a grid of GPC clusters; None for any other type. Refuses
        the clusters Bob never writes (GPU-wide ones)."""
        kind = self.qmd_type()
        if kind is None or "CGA" not in kind:
            return None
        if kind != "GRID_GPC_CGA":
            raise DecodeError(f"QMD type {kind}: Bob's clusters are GRID_GPC_CGA only")
        return (self.get("GPC_CGA_WIDTH"), self.get("GPC_CGA_HEIGHT"),
                self.get("GPC_CGA_DEPTH"))

    def dispatch(self) -> Dispatch:
        s = _SCHEMAS[self.version]
        banks: dict[int, tuple[int, int]] = {}
        valid = self.layout.families[s.cbuf_valid]
        lowers = self.layout.families[s.cbuf_address[0]]
        uppers = self.layout.families[s.cbuf_address[1]]
        sizes = self.layout.families[s.cbuf_size]
        for index, flag in enumerate(valid):
            if flag.extract(self.bits):
                size = sizes[index]
                banks[index] = (self._join(lowers[index].name, uppers[index].name),
                                size.extract(self.bits) << size.shift)
        releases = []
        for names in s.releases:
            if not self.get(names.enable):
                continue
            payload = self.get(names.payload[0])
            if self.get(names.payload64):
                payload |= self.get(names.payload[1]) << WORD_BITS
            structure = self.get(names.structure)
            releases.append(Release(
                self._join(*names.address), payload,
                self.value_name(names.structure, structure) or str(structure),
            ))
        dependents = []
        for names in s.dependents:
            if not self.get(names.enable):
                continue
            action = self.get(names.action)
            dependents.append(Dependent(
                self.get(names.pointer) << DEPENDENT_POINTER_SHIFT,
                self.value_name(names.action, action) or str(action),
                bool(self.get(names.prefetch)),
            ))
        arrive = wait = None
        if "ARRIVE_AT_LATCH_VALID" in self.layout.fields:  # V04 on
            if self.get("ARRIVE_AT_LATCH_VALID"):
                arrive = self.get("ARRIVE_AT_LATCH_ID")
            if self.get("WAIT_ON_LATCH_VALID"):
                wait = self.get("WAIT_ON_LATCH_ID")
        pre_exit = ("ENABLE_PROGRAM_PRE_EXIT" in self.layout.fields
                    and bool(self.get("ENABLE_PROGRAM_PRE_EXIT")))
        cluster = self._cluster()
        grid = (self.get(s.grid[0]), self.get(s.grid[1]), self.get(s.grid[2]))
        if cluster is not None:  # a grid of clusters counts clusters: the CTAs are C times
            grid = (grid[0] * cluster[0], grid[1] * cluster[1], grid[2] * cluster[2])
        return Dispatch(
            cluster=cluster,
            arrive_latch=arrive,
            wait_latch=wait,
            program_pre_exit=pre_exit,
            major_version=self.get("QMD_MAJOR_VERSION"),
            program_address=self._join(*s.program),
            grid=grid,
            block=(self.get(s.block[0]), self.get(s.block[1]), self.get(s.block[2])),
            registers=self.get(s.registers),
            barriers=self.get("BARRIER_COUNT"),
            shared_memory=self.get("SHARED_MEMORY_SIZE"),
            constant_buffers=banks,
            releases=tuple(releases),
            dependents=tuple(dependents),
        )


def decode_qmd(record: bytes, compute_class: int) -> DecodedQmd:
    return DecodedQmd(record, compute_class)


def _dependent_shift() -> int:
    """A dependent pointer holds a QMD address as SEND_PCAS_A does: the shift its field's
    name declares (every compute class in the headers names it the same)."""
    shifts = {f.shift for info in TABLES.classes.values()
              for name, f in info.fields.items() if name == "SEND_PCAS_A_QMD_ADDRESS_SHIFTED8"}
    if len(shifts) != 1:
        raise DecodeError("the vendored headers do not agree on SEND_PCAS_A's QMD address shift")
    return shifts.pop()


DEPENDENT_POINTER_SHIFT = _dependent_shift()


def qmd_launch(encoded: EncodedProgram, address: int) -> int:
    """The launch whose QMD starts at `address`; a DecodeError for any other address."""
    base = encoded.qmd_table.base or 0
    offset = address - base
    count = len(encoded.qmd_table.data) // encoded.qmd_stride
    if not 0 <= offset < count * encoded.qmd_stride or offset % encoded.qmd_stride:
        raise DecodeError(f"{address:#x} is not a QMD: the table holds {count} QMDs from "
                          f"{base:#x}, {encoded.qmd_stride} bytes apart")
    return offset // encoded.qmd_stride


def follow_chain(encoded: EncodedProgram, first: int,
                 read: Callable[[int, int], bytes] | None = None,
                 ) -> list[tuple[int, DecodedQmd]]:
    """The QMDs a dispatch of the QMD at `first` runs, in order: it, then each one's
    dependent QMD 0, as (address, QMD). `read(address, size)` reads memory (default: the
    encoded components). Refuses in one line a pointer that is not at a QMD of the table,
    a second dependent, an action other than QMD_SCHEDULE, and a cycle."""
    layout = TABLES.qmd[QMD_VERSION_OF_CLASS[encoded.compute_class]]
    read = read or (lambda address, size: _component_bytes(encoded, address, size))
    chain: list[tuple[int, DecodedQmd]] = []
    seen: dict[int, int] = {}
    address: int | None = first
    while address is not None:
        launch = qmd_launch(encoded, address)
        if address in seen:
            path = " -> ".join(str(qmd_launch(encoded, a)) for a, _ in chain[seen[address]:])
            raise DecodeError(f"the QMD chain from {first:#x} cycles: launch {path} -> {launch}")
        seen[address] = len(chain)
        qmd = decode_qmd(read(address, layout.record_bytes), encoded.compute_class)
        version = int(qmd.version[:2])
        if qmd.get("QMD_MAJOR_VERSION") != version:
            raise DecodeError(f"the QMD of launch {launch} at {address:#x} says major version "
                              f"{qmd.get('QMD_MAJOR_VERSION')}, not {version}: not a QMD")
        dispatch = qmd.dispatch()
        if chain:
            _check_latch(chain[-1][1].dispatch(), dispatch, launch)
        chain.append((address, qmd))
        dependents = dispatch.dependents
        if len(dependents) > 1 or any(d.action != "QMD_SCHEDULE" for d in dependents):
            raise DecodeError(f"the QMD of launch {launch} at {address:#x} asks for "
                              f"{[(hex(d.address), d.action) for d in dependents]}; Bob's chains "
                              "schedule one dependent QMD (QMD_SCHEDULE)")
        if dispatch.program_pre_exit and not dependents:
            raise DecodeError(f"the QMD of launch {launch} at {address:#x} enables program "
                              "pre-exit but schedules no dependent")
        address = dependents[0].address if dependents else None
    return chain


def _check_latch(before: Dispatch, after: Dispatch, launch: int) -> None:
    """A dependent scheduled early (its predecessor's program pre-exit) must wait on the
    latch its predecessor arrives at when it completes: else it could read what the
    predecessor has not finished writing."""
    if before.program_pre_exit and (before.arrive_latch is None
                                    or after.wait_latch != before.arrive_latch):
        raise DecodeError(
            f"launch {launch} may start before its predecessor completes (program pre-exit) "
            f"but waits on latch {after.wait_latch}, not on the predecessor's "
            f"{before.arrive_latch}")


# -- constant bank 0's driver area ----------------------------------------------------------

# Not in NVIDIA's headers: the words compiled code reads below the parameter base,
# as the CUDA driver fills them (seen on the H200, docs/RAW-HOPPER.md): name,
# byte offset, size.
DRIVER_AREA_WORDS = (
    ("blockDim.x", 0x00, 4), ("blockDim.y", 0x04, 4), ("blockDim.z", 0x08, 4),
    ("gridDim.x", 0x0C, 4), ("gridDim.y", 0x10, 4), ("gridDim.z", 0x14, 4),
    ("shared_window", 0x18, 8), ("local_window", 0x20, 8), ("stack_top", 0x28, 4),
    ("dynamic_shared", 0x2C, 4),
    # A cluster launch's (the code NVRTC compiles for each of PTX's cluster registers):
    # %is_explicit_cluster, %cluster_nctaid, the bits of the f32 reciprocals of its
    # y and z (and x), %nclusterid, %cluster_nctarank.
    ("explicit_cluster", 0x140, 4),
    ("cluster_nctaid.x", 0x144, 4), ("cluster_nctaid.y", 0x148, 4),
    ("cluster_nctaid.z", 0x14C, 4),
    ("cluster_reciprocal.x", 0x150, 4), ("cluster_reciprocal.y", 0x154, 4),
    ("cluster_reciprocal.z", 0x158, 4),
    ("nclusterid.x", 0x15C, 4), ("nclusterid.y", 0x160, 4), ("nclusterid.z", 0x164, 4),
    ("cluster_nctarank", 0x188, 4),
)
_SIZE_FORMATS = {4: "<I", 8: "<Q"}


@dataclass(frozen=True)
class DriverArea:
    block: tuple[int, int, int]
    grid: tuple[int, int, int]
    shared_window: int
    local_window: int
    stack_top: int
    dynamic_shared: int  # bytes of dynamic shared memory (%dynamic_smem_size)
    # A cluster launch's words (all zero for a grid of CTAs): whether it is one, its CTAs
    # per cluster, the f32 reciprocals of those, its clusters, and the CTAs of one.
    explicit_cluster: int = 0
    cluster: tuple[int, int, int] = (0, 0, 0)
    cluster_reciprocals: tuple[float, float, float] = (0.0, 0.0, 0.0)
    clusters: tuple[int, int, int] = (0, 0, 0)
    cluster_ctas: int = 0


def _driver_words(block: bytes) -> dict[str, int]:
    end = max(offset + size for _, offset, size in DRIVER_AREA_WORDS)
    if len(block) < end:
        raise DecodeError(f"a constant buffer of {len(block)} bytes cannot hold the "
                          f"{end}-byte driver area")
    return {name: struct.unpack_from(_SIZE_FORMATS[size], block, offset)[0]
            for name, offset, size in DRIVER_AREA_WORDS}


def decode_driver_area(block: bytes) -> DriverArea:
    """The driver area at the start of a constant bank 0."""
    words = _driver_words(block)
    return DriverArea(
        block=(words["blockDim.x"], words["blockDim.y"], words["blockDim.z"]),
        grid=(words["gridDim.x"], words["gridDim.y"], words["gridDim.z"]),
        shared_window=words["shared_window"],
        local_window=words["local_window"],
        stack_top=words["stack_top"],
        dynamic_shared=words["dynamic_shared"],
        explicit_cluster=words["explicit_cluster"],
        cluster=(words["cluster_nctaid.x"], words["cluster_nctaid.y"],
                 words["cluster_nctaid.z"]),
        cluster_reciprocals=tuple(  # type: ignore[arg-type]
            struct.unpack("<f", struct.pack("<I", words[f"cluster_reciprocal.{axis}"]))[0]
            for axis in "xyz"),
        clusters=(words["nclusterid.x"], words["nclusterid.y"], words["nclusterid.z"]),
        cluster_ctas=words["cluster_nctarank"],
    )


# -- the listing ---------------------------------------------------------------------------


def _component_bytes(encoded: EncodedProgram, address: int, size: int) -> bytes:
    for component in encoded.components:
        if component.base is not None and component.base <= address and (
                address + size <= component.base + len(component.data)):
            offset = address - component.base
            return component.data[offset:offset + size]
    raise DecodeError(f"[{address:#x}, {address + size:#x}) is in no encoded component")


def _regions_at(plan: Plan, address: int) -> str:
    names = [p.name for p in plan.placed_regions if p.address == address]
    return " | ".join(names) if names else "no region"


def _parameter_lines(plan: Plan, program_address: int, block: bytes) -> list[str]:
    lines = []
    labelled: set[int] = set()
    words = _driver_words(block)
    for name, offset, size in DRIVER_AREA_WORDS:
        labelled.update(range(offset, offset + size, 4))
        lines.append(f"      +{offset:#05x}  {name:<16} {words[name]:#0{2 + 2 * size}x}  "
                     "(driver area)")
    regions = [p.name for p in plan.placed_regions if p.address == program_address]
    if len(regions) == 1:
        region = plan.region(regions[0])
        for slot in argument_slots(plan.target, region.params):
            labelled.update(range(slot.offset, slot.offset + slot.size, 4))
            if isinstance(slot.param, PointerParam):
                (value,) = struct.unpack_from("<Q", block, slot.offset)
                tensor = plan.tensor_at(value)
                where = (f"tensor {tensor.name}+{value - tensor.address:#x}" if tensor
                         else "outside every tensor")
                lines.append(f"      +{slot.offset:#05x}  {slot.param.name:<16} "
                             f"{value:#018x}  ({where})")
            else:
                (bits,) = struct.unpack_from("<I", block, slot.offset)
                if slot.param.dtype == "f32":
                    (real,) = struct.unpack("<f", struct.pack("<I", bits))
                    text = f"f32 {real!r}"
                else:
                    text = f"u32 {bits}"
                lines.append(f"      +{slot.offset:#05x}  {slot.param.name:<16} "
                             f"{bits:#010x}  ({text})")
    for offset in range(0, len(block), 4):
        (word,) = struct.unpack_from("<I", block, offset)
        if word and offset not in labelled:
            lines.append(f"      +{offset:#05x}  (unlabelled)     {word:#010x}")
    return lines


def _qmd_lines(encoded: EncodedProgram, plan: Plan, qmd_address: int) -> list[str]:
    layout = TABLES.qmd[QMD_VERSION_OF_CLASS[encoded.compute_class]]
    record = _component_bytes(encoded, qmd_address, layout.record_bytes)
    qmd = decode_qmd(record, encoded.compute_class)
    lines = [f"    QMD V{qmd.version} at {qmd_address:#x}:"]
    for f, value in qmd.nonzero():
        label = qmd.value_name(f.name, value)
        shown = f"{value:#x}" + (f" {label}" if label else "")
        lines.append(f"      [{f.high:4}:{f.low:<4}] {f.name:<40} = {shown}")
    stray = qmd.unexplained()
    if stray:
        lines.append(f"      unexplained bits: {stray:#x}")
    dispatch = qmd.dispatch()
    lines.append(f"    program {dispatch.program_address:#x} "
                 f"({_regions_at(plan, dispatch.program_address)}), grid {dispatch.grid}, "
                 f"block {dispatch.block}")
    for bank, (address, size) in dispatch.constant_buffers.items():
        lines.append(f"    constant buffer {bank} at {address:#x}, {size} bytes:")
        block = _component_bytes(encoded, address, size)
        lines += _parameter_lines(plan, dispatch.program_address, block)
        area = decode_driver_area(block)
        if bank == 0 and (area.block, area.grid) != (dispatch.block, dispatch.grid):
            lines.append(f"    DRIVER AREA DISAGREES with the QMD: blockDim {area.block}, "
                         f"gridDim {area.grid}")
    for release in dispatch.releases:
        lines.append(f"    on completion: release {release.payload} at {release.address:#x} "
                     f"({release.structure})")
    for dependent in dispatch.dependents:
        lines.append(f"    on completion: {dependent.action} the QMD at {dependent.address:#x} "
                     f"(launch {qmd_launch(encoded, dependent.address)}"
                     f"{', prefetched' if dependent.prefetch else ''})")
    if dispatch.program_pre_exit:
        lines.append("    its CTAs schedule the dependent as they exit (program pre-exit)")
    if dispatch.arrive_latch is not None:
        lines.append(f"    on completion: arrive at latch {dispatch.arrive_latch}")
    if dispatch.wait_latch is not None:
        lines.append(f"    before running: wait on latch {dispatch.wait_latch}, then invalidate "
                     "the data caches")
    return lines


def disassemble(encoded: EncodedProgram, plan: Plan) -> str:
    """Every GPFIFO entry, method, QMD field set and parameter word, as text."""
    lines = [
        f"NVIDIA command stream for {encoded.target} ({encoded.submission_policy} "
        "submissions): compute "
        f"{_class(encoded.compute_class).name} ({encoded.compute_class:#x}), QMD "
        f"V{QMD_VERSION_OF_CLASS[encoded.compute_class]}, channel "
        f"{_class(encoded.host_class).name} ({encoded.host_class:#x})",
        "components:",
    ]
    for component in encoded.components:
        base = "(channel ring)" if component.base is None else f"{component.base:#x}"
        lines.append(f"  {component.name:<11} {base:>16}  {len(component.data)} bytes")
    entries = decode_gpfifo(encoded.gpfifo.data, encoded.host_class)
    bindings: dict[int, int] = {}
    listed: set[int] = set()
    for entry in entries:
        what = ("set-up" if entry.index == 0
                else _submission_label(plan, entry.index - 1))
        lines.append(f"GPFIFO entry {entry.index} ({what}): {entry.words} words at "
                     f"{entry.address:#x}  [{entry.fetch}, {entry.level}, {entry.sync}]")
        words = struct.unpack(f"<{entry.words}I",
                              _component_bytes(encoded, entry.address, 4 * entry.words))
        for call in decode_segment(words, entry.address, encoded.host_class, bindings):
            lines.append("  " + call.describe())
            if call.name == "SEND_PCAS_A":
                qmd_address = call.field("QMD_ADDRESS_SHIFTED8").unshifted
                chain = follow_chain(encoded, qmd_address)
                for position, (address, _) in enumerate(chain):
                    launch = qmd_launch(encoded, address)
                    label = (plan.launches[launch].label or plan.launches[launch].region
                             if launch < plan.launch_count else "not in the plan")
                    how = ("" if position == 0 else
                           f", scheduled by launch {qmd_launch(encoded, chain[position - 1][0])}"
                           " on completion")
                    lines.append(f"    -> QMD of launch {launch} ({label}{how})")
                    if address in listed:
                        lines.append("    (listed above)")
                    else:
                        listed.add(address)
                        lines += _qmd_lines(encoded, plan, address)
    return "\n".join(lines) + "\n"


def _submission_label(plan: Plan, index: int) -> str:
    if not 0 <= index < plan.submission_count:
        return f"submission {index}, not in the plan"
    submission = plan.submissions[index]
    return (f"submission {index}: launches {submission.first_launch}.."
            f"{submission.first_launch + submission.count - 1}, semaphore {submission.semaphore}")
