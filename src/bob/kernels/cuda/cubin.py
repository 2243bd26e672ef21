"""Read a compiled CUDA image (cubin, an ELF64 file): the facts a region carries.

Only reading: checking an image against a plan and composing regions from it
is ``bob.kernels.cuda.regions``'s work.

Per kernel entry the image holds:

- ``.text.<entry>``: the machine code.
- ``.nv.info``: attributes of the whole image; ``EIATTR_REGCOUNT`` gives each
  entry's register count by symbol index. On sm_86 NVRTC also puts the count
  in the top byte of the ``.text.<entry>`` section's ``sh_info`` (the low
  bytes are a symbol index); on sm_90 it does not (checked with NVRTC 13.5).
  Where both are present they must agree.
- ``.nv.info.<entry>``: attributes of one entry. ``EIATTR_PARAM_CBANK`` gives
  the parameter window in constant bank 0 (its offset is the architecture's
  parameter base: 0x160 on sm_86, 0x210 on sm_90) and ``EIATTR_KPARAM_INFO``
  each parameter's ordinal, offset and size; ``EIATTR_MAX_THREADS`` and
  ``EIATTR_REQNTID`` come from ``__launch_bounds__`` / ``__reqntid__``.
- ``.nv.shared.<entry>``: static shared memory (a NOBITS section: its size);
  on sm_90 it includes the 1 KiB the system reserves per block (see
  ``RESERVED_SHARED_BYTES``). A region carries this whole figure.

An attribute record is ``u8 format, u8 code`` then, by format: NVAL two zero
bytes, BVAL and HVAL a u16 value, SVAL a u16 length and that many bytes.
The codes below are those public tools print (cuobjdump's names); the layout
was checked against NVRTC 13.5 output for sm_86 and sm_90.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from bob.errors import RunFailure

# -- ELF ---------------------------------------------------------------------
ELF_MAGIC = b"\x7fELF"
ELFCLASS64 = 2
ELFDATA2LSB = 1
EM_CUDA = 190
SHT_SYMTAB = 2
SHT_NOBITS = 8
STT_FUNC = 2

_ELF_HEADER = struct.Struct("<16sHHIQQQIHHHHHH")
_SECTION_HEADER = struct.Struct("<IIQQQQIIQQ")
_SYMBOL = struct.Struct("<IBBHQQ")

# e_ident[EI_ABIVERSION] from which the SM number sits in e_flags bits 8..15
# (before: bits 0..7). NVRTC 13.5 writes ABI version 8.
_ABI_SM_IN_SECOND_BYTE = 8

# -- .nv.info ----------------------------------------------------------------
EIFMT_NVAL = 0x01  # no value (two zero bytes)
EIFMT_BVAL = 0x02  # a byte value (in a u16)
EIFMT_HVAL = 0x03  # a u16 value
EIFMT_SVAL = 0x04  # u16 size, then that many bytes

EIATTR_MAX_THREADS = 0x05  # SVAL: u32 x, y, z (__launch_bounds__)
EIATTR_PARAM_CBANK = 0x0A  # SVAL: u32 symbol, u16 offset, u16 size
EIATTR_REQNTID = 0x10  # SVAL: u32 x, y, z (__reqntid__ / required block)
EIATTR_FRAME_SIZE = 0x11  # SVAL: u32 symbol, u32 bytes (per-thread stack frame)
EIATTR_KPARAM_INFO = 0x17  # SVAL: u32 index, u16 ordinal, u16 offset, u32 flags
EIATTR_CBANK_PARAM_SIZE = 0x19  # HVAL: parameter bytes
EIATTR_MAXREG_COUNT = 0x1B  # HVAL: the register limit the compiler honoured
EIATTR_REGCOUNT = 0x2F  # SVAL: u32 symbol, u32 registers
EIATTR_CUDA_API_VERSION = 0x37  # SVAL: u32 version

# KPARAM_INFO flags word: bits 12..16 the constant bank, bit 17 set when the
# parameter is not in a constant bank, bits 18..31 the size in bytes.
_KPARAM_NOT_CBANK = 1 << 17
_KPARAM_SIZE_SHIFT = 18
_KPARAM_SIZE_MASK = 0x3FFF

MAX_REGISTERS = 255

# sm_80 and later reserve 1 KiB of shared memory per block for the system
# (CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK). NVRTC 13 for sm_90
# counts it in the .nv.shared.<entry> section of every kernel that uses shared
# memory, and marks such an image with a .nv.shared.reserved.0 section; for
# sm_86 it counts only the kernel's own variables. The driver reports the
# kernel's own part (CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES); checked on an H200.
RESERVED_SHARED_BYTES = 1024
RESERVED_SHARED_MARK = ".nv.shared.reserved.0"


@dataclass(frozen=True)
class Section:
    index: int
    name: str
    type: int
    flags: int
    offset: int
    size: int
    link: int
    info: int


@dataclass(frozen=True)
class Symbol:
    index: int
    name: str
    info: int
    other: int
    section: int
    value: int
    size: int

    @property
    def is_function(self) -> bool:
        return self.info & 0xF == STT_FUNC


@dataclass(frozen=True)
class Attribute:
    fmt: int
    code: int
    value: int | bytes | None  # HVAL/BVAL an int, SVAL the bytes, NVAL None

    def words(self) -> tuple[int, ...]:
        if not isinstance(self.value, bytes) or len(self.value) % 4:
            raise RunFailure(f".nv.info attribute 0x{self.code:02x} is not a list of words")
        return struct.unpack(f"<{len(self.value) // 4}I", self.value)


@dataclass(frozen=True)
class KernelParam:
    ordinal: int
    offset: int  # bytes from the parameter base
    size: int


@dataclass(frozen=True)
class Kernel:
    """One entry point of the image with the resources it declares."""

    entry: str
    code: bytes
    registers: int
    shared_bytes: int  # the .nv.shared.<entry> section: the block's whole shared window
    parameter_base: int  # offset of the parameters in constant bank 0
    parameter_bytes: int
    params: tuple[KernelParam, ...]  # by ordinal
    frame_bytes: int = 0
    max_threads: tuple[int, int, int] | None = None
    required_block: tuple[int, int, int] | None = None
    reserved_shared_bytes: int = 0  # the system's part of shared_bytes, where it is counted

    @property
    def static_shared_bytes(self) -> int:
        """The kernel's own shared variables, as the driver reports them."""
        return self.shared_bytes - self.reserved_shared_bytes


class Cubin:
    """The sections, symbols and kernels of one cubin."""

    def __init__(self, image: bytes):
        self.image = bytes(image)
        header = self._header()
        self.abi_version = self.image[8]
        self.flags = header["flags"]
        self.sections = self._sections(header)
        self._by_name = {section.name: section for section in self.sections}
        self.symbols = self._symbols()

    # -- ELF structure ------------------------------------------------------
    def _header(self) -> dict[str, int]:
        if len(self.image) < _ELF_HEADER.size or not self.image.startswith(ELF_MAGIC):
            raise RunFailure("not a cubin: the image does not start with an ELF header")
        fields = _ELF_HEADER.unpack_from(self.image, 0)
        ident, machine = fields[0], fields[2]
        if ident[4] != ELFCLASS64 or ident[5] != ELFDATA2LSB:
            raise RunFailure("not a cubin: expected a 64-bit little-endian ELF image")
        if machine != EM_CUDA:
            raise RunFailure(f"not a cubin: ELF machine {machine}, expected {EM_CUDA} (CUDA)")
        shoff, flags, shentsize, shnum, shstrndx = (fields[6], fields[7], fields[11],
                                                   fields[12], fields[13])
        if shentsize != _SECTION_HEADER.size:
            raise RunFailure(f"cubin section headers are {shentsize} bytes, expected 64")
        if shoff + shnum * shentsize > len(self.image) or shstrndx >= shnum:
            raise RunFailure("cubin section header table runs past the end of the image")
        return {"shoff": shoff, "flags": flags, "shnum": shnum, "shstrndx": shstrndx}

    def _sections(self, header: dict[str, int]) -> tuple[Section, ...]:
        raw = [
            _SECTION_HEADER.unpack_from(self.image, header["shoff"] + i * _SECTION_HEADER.size)
            for i in range(header["shnum"])
        ]
        names = raw[header["shstrndx"]]
        sections = []
        for index, (name, kind, flags, _, offset, size, link, info, _, _) in enumerate(raw):
            if kind != SHT_NOBITS and offset + size > len(self.image):
                raise RunFailure(f"cubin section {index} runs past the end of the image")
            sections.append(Section(index, self._string(names[4], names[5], name), kind, flags,
                                    offset, size, link, info))
        return tuple(sections)

    def _string(self, table_offset: int, table_size: int, offset: int) -> str:
        if offset >= table_size:
            raise RunFailure(f"cubin string offset {offset} is outside its table")
        start = table_offset + offset
        end = self.image.find(b"\0", start, table_offset + table_size)
        if end < 0:
            raise RunFailure("cubin string table entry is not terminated")
        return self.image[start:end].decode(errors="replace")

    def _symbols(self) -> tuple[Symbol, ...]:
        tables = [s for s in self.sections if s.type == SHT_SYMTAB]
        if len(tables) != 1:
            raise RunFailure(f"cubin has {len(tables)} symbol tables, expected 1")
        table = tables[0]
        strings = self.sections[table.link]
        symbols = []
        for index in range(table.size // _SYMBOL.size):
            name, info, other, shndx, value, size = _SYMBOL.unpack_from(
                self.image, table.offset + index * _SYMBOL.size)
            symbols.append(Symbol(index, self._string(strings.offset, strings.size, name),
                                  info, other, shndx, value, size))
        return tuple(symbols)

    def section(self, name: str) -> Section | None:
        return self._by_name.get(name)

    def data(self, section: Section) -> bytes:
        if section.type == SHT_NOBITS:
            return b""
        return self.image[section.offset:section.offset + section.size]

    @property
    def sm(self) -> int:
        """The SM version the image is for (86, 90, ...), from the ELF flags."""
        if self.abi_version >= _ABI_SM_IN_SECOND_BYTE:
            return (self.flags >> 8) & 0xFF
        return self.flags & 0xFF

    # -- .nv.info -----------------------------------------------------------
    def attributes(self, section_name: str) -> tuple[Attribute, ...]:
        section = self.section(section_name)
        if section is None:
            return ()
        return parse_attributes(self.data(section), section_name)

    def entries(self) -> tuple[str, ...]:
        """Kernel entry points: functions with their own .text and .nv.info sections."""
        names = []
        for symbol in self.symbols:
            if not symbol.is_function or not symbol.name:
                continue
            if self.section(f".nv.info.{symbol.name}") is None:
                continue  # a device function, not an entry point
            names.append(symbol.name)
        return tuple(names)

    def kernels(self) -> dict[str, Kernel]:
        return {entry: self.kernel(entry) for entry in self.entries()}

    def kernel(self, entry: str) -> Kernel:
        symbol = next((s for s in self.symbols if s.name == entry and s.is_function), None)
        text = self.section(f".text.{entry}")
        if symbol is None or text is None:
            raise RunFailure(f"the image has no kernel entry {entry!r} "
                             f"(entries: {', '.join(self.entries()) or 'none'})")
        info = self.attributes(f".nv.info.{entry}")
        base, size = self._parameter_window(entry, info)
        shared = self.section(f".nv.shared.{entry}")
        shared_bytes = shared.size if shared else 0
        reserved = 0
        if shared_bytes and self.section(RESERVED_SHARED_MARK) is not None:
            reserved = RESERVED_SHARED_BYTES
            if shared_bytes < reserved:
                raise RunFailure(f"kernel {entry!r}: {shared_bytes} shared bytes cannot hold "
                                 f"the {reserved} reserved ones")
        return Kernel(
            entry=entry,
            code=self.data(text),
            registers=self._registers(entry, symbol, text),
            shared_bytes=shared_bytes,
            reserved_shared_bytes=reserved,
            parameter_base=base,
            parameter_bytes=size,
            params=self._params(entry, info),
            frame_bytes=self._global_value(EIATTR_FRAME_SIZE, symbol.index) or 0,
            max_threads=_dim3(info, EIATTR_MAX_THREADS),
            required_block=_dim3(info, EIATTR_REQNTID),
        )

    def _global_value(self, code: int, symbol_index: int) -> int | None:
        """A (symbol, value) attribute of the image-wide .nv.info for one symbol."""
        values = set()
        for attribute in self.attributes(".nv.info"):
            if attribute.code != code:
                continue
            symbol, value = attribute.words()[:2]
            if symbol == symbol_index:
                values.add(value)
        if len(values) > 1:
            raise RunFailure(f"symbol {symbol_index} has conflicting .nv.info 0x{code:02x} "
                             f"values {sorted(values)}")
        return values.pop() if values else None

    def _registers(self, entry: str, symbol: Symbol, text: Section) -> int:
        from_info = self._global_value(EIATTR_REGCOUNT, symbol.index)
        from_header = text.info >> 24 or None
        if from_info is not None and from_header is not None and from_info != from_header:
            raise RunFailure(f"kernel {entry!r}: EIATTR_REGCOUNT says {from_info} registers, "
                             f"the .text section header {from_header}")
        registers = from_info if from_info is not None else from_header
        if registers is None:
            raise RunFailure(f"kernel {entry!r}: the image records no register count")
        if not 0 < registers <= MAX_REGISTERS:
            raise RunFailure(f"kernel {entry!r}: {registers} registers is outside "
                             f"1..{MAX_REGISTERS}")
        return registers

    def _parameter_window(self, entry: str, info: tuple[Attribute, ...]) -> tuple[int, int]:
        banks = [a for a in info if a.code == EIATTR_PARAM_CBANK]
        if len(banks) != 1:
            raise RunFailure(f"kernel {entry!r}: {len(banks)} EIATTR_PARAM_CBANK records, "
                             "expected 1")
        if not isinstance(banks[0].value, bytes) or len(banks[0].value) != 8:
            raise RunFailure(f"kernel {entry!r}: EIATTR_PARAM_CBANK is not 8 bytes")
        _, offset, size = struct.unpack("<IHH", banks[0].value)
        declared = [a.value for a in info if a.code == EIATTR_CBANK_PARAM_SIZE]
        if declared and declared[0] != size:
            raise RunFailure(f"kernel {entry!r}: EIATTR_CBANK_PARAM_SIZE {declared[0]} != "
                             f"EIATTR_PARAM_CBANK size {size}")
        return offset, size

    def _params(self, entry: str, info: tuple[Attribute, ...]) -> tuple[KernelParam, ...]:
        params = []
        for attribute in info:
            if attribute.code != EIATTR_KPARAM_INFO:
                continue
            if not isinstance(attribute.value, bytes) or len(attribute.value) != 12:
                raise RunFailure(f"kernel {entry!r}: EIATTR_KPARAM_INFO is not 12 bytes")
            _, ordinal, offset, flags = struct.unpack("<IHHI", attribute.value)
            if flags & _KPARAM_NOT_CBANK:
                raise RunFailure(f"kernel {entry!r}: parameter {ordinal} is not in a "
                                 "constant bank")
            size = (flags >> _KPARAM_SIZE_SHIFT) & _KPARAM_SIZE_MASK
            params.append(KernelParam(ordinal, offset, size))
        return tuple(sorted(params, key=lambda p: p.ordinal))


def parse_attributes(data: bytes, where: str = ".nv.info") -> tuple[Attribute, ...]:
    """Decode a .nv.info section into its attribute records, in order."""
    attributes = []
    position = 0
    while position < len(data):
        if position + 4 > len(data):
            raise RunFailure(f"{where}: truncated attribute at byte {position}")
        fmt, code, half = struct.unpack_from("<BBH", data, position)
        position += 4
        if fmt == EIFMT_NVAL:
            value: int | bytes | None = None
        elif fmt in (EIFMT_BVAL, EIFMT_HVAL):
            value = half
        elif fmt == EIFMT_SVAL:
            if position + half > len(data):
                raise RunFailure(f"{where}: attribute 0x{code:02x} runs past the section")
            value = data[position:position + half]
            position += half
        else:
            raise RunFailure(f"{where}: unknown attribute format {fmt} at byte {position - 4}")
        attributes.append(Attribute(fmt, code, value))
    return tuple(attributes)


def _dim3(info: tuple[Attribute, ...], code: int) -> tuple[int, int, int] | None:
    for attribute in info:
        if attribute.code == code:
            words = attribute.words()
            if len(words) != 3:
                raise RunFailure(f".nv.info attribute 0x{code:02x} is not three words")
            return words[0], words[1], words[2]
    return None


def describe(kernel: Kernel) -> str:
    params = " ".join(f"{p.offset}:{p.size}" for p in kernel.params)
    bounds = f" max_threads={kernel.max_threads}" if kernel.max_threads else ""
    reserved = (f" ({kernel.reserved_shared_bytes} reserved)"
                if kernel.reserved_shared_bytes else "")
    return (f"{kernel.entry}: {len(kernel.code)} code bytes, {kernel.registers} registers, "
            f"{kernel.shared_bytes} shared bytes{reserved}, "
            f"parameters at 0x{kernel.parameter_base:x} "
            f"({kernel.parameter_bytes} bytes: {params}){bounds}")
