"""Generate Bob's NVIDIA field tables from the vendored class headers.

    python tools/gen_nv_tables.py           # rewrite src/bob/backends/nv/fields_generated.py
    python tools/gen_nv_tables.py --check   # exit 1 when the checked-in module is stale

Bit positions are facts from NVIDIA's published headers (vendored, with their
licence, in src/bob/backends/nv/headers/); nobody types them by hand. This
script reads the headers line by line, keeps the QMD fields, class methods and
host formats that Bob's encoder uses (the WANTED lists below) together with
every named value of those fields, and writes them as plain dictionaries.

The decoder (src/bob/backends/nv/decoder.py) parses the same headers with its
own parser at import time, so a mistake here cannot hide in both.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HEADERS = ROOT / "src" / "bob" / "backends" / "nv" / "headers"
OUTPUT = ROOT / "src" / "bob" / "backends" / "nv" / "fields_generated.py"


# -- what Bob uses ---------------------------------------------------------


@dataclass(frozen=True)
class QmdWanted:
    table: str  # the Python name prefix, e.g. "QMDV03_00"
    header: str
    prefix: str  # the C name prefix in the header
    fields: tuple[str, ...]  # an indexed field is named with its index: "X(0)"


@dataclass(frozen=True)
class ClassWanted:
    table: str  # "NVC7C0"
    header: str
    class_name: str  # the #define naming the class number
    methods: tuple[str, ...]
    fields: tuple[str, ...]  # full field names, methods' data fields and word formats
    constants: tuple[str, ...] = ()


# QMD V03_00 is a layout version, not a class: NVIDIA publishes it in the QMD
# header of every class that accepts it. The copy in HOPPER_COMPUTE_A's
# clcbc0qmd.h is the one among NVIDIA's published headers that carries both
# versions Bob needs; it matches ADA_COMPUTE_A's clc9c0qmd.h field for field.
QMD_HEADER = "clcbc0qmd.h"
_QMD_COMMON = (
    "API_VISIBLE_CALL_LIMIT",
    "SAMPLER_INDEX",
    "INVALIDATE_TEXTURE_HEADER_CACHE",
    "INVALIDATE_TEXTURE_SAMPLER_CACHE",
    "INVALIDATE_TEXTURE_DATA_CACHE",
    "INVALIDATE_SHADER_DATA_CACHE",
    "CWD_MEMBAR_TYPE",
    "QMD_MAJOR_VERSION",
    "SHARED_MEMORY_SIZE",
    "MIN_SM_CONFIG_SHARED_MEM_SIZE",
    "MAX_SM_CONFIG_SHARED_MEM_SIZE",
    "TARGET_SM_CONFIG_SHARED_MEM_SIZE",
    "CTA_THREAD_DIMENSION0",
    "CTA_THREAD_DIMENSION1",
    "CTA_THREAD_DIMENSION2",
    "BARRIER_COUNT",
    "PROGRAM_ADDRESS_LOWER",
    "PROGRAM_ADDRESS_UPPER",
    "CONSTANT_BUFFER_VALID(0)",
    "CONSTANT_BUFFER_INVALIDATE(0)",
    "CONSTANT_BUFFER_SIZE_SHIFTED4(0)",
)
QMD_WANTED = (
    QmdWanted("QMDV03_00", QMD_HEADER, "NVCBC0_QMDV03_00_", _QMD_COMMON + (
        "QMD_VERSION",
        "SM_GLOBAL_CACHING_ENABLE",
        "CTA_RASTER_WIDTH",
        "CTA_RASTER_HEIGHT",
        "CTA_RASTER_DEPTH",
        "REGISTER_COUNT_V",
        "CONSTANT_BUFFER_ADDR_LOWER(0)",
        "CONSTANT_BUFFER_ADDR_UPPER(0)",
        "RELEASE0_ADDRESS_LOWER",
        "RELEASE0_ADDRESS_UPPER",
        "RELEASE0_MEMBAR_TYPE",
        "RELEASE0_ENABLE",
        "RELEASE0_STRUCTURE_SIZE",
        "RELEASE0_PAYLOAD_LOWER",
        "DEPENDENT_QMD0_ENABLE",
        "DEPENDENT_QMD0_ACTION",
        "DEPENDENT_QMD0_PREFETCH",
        "DEPENDENT_QMD0_POINTER",
    )),
    QmdWanted("QMDV04_00", QMD_HEADER, "NVCBC0_QMDV04_00_", _QMD_COMMON + (
        "QMD_TYPE",
        "QMD_MINOR_VERSION",
        "GRID_WIDTH",
        "GRID_HEIGHT",
        "GRID_DEPTH",
        "REGISTER_COUNT",
        "CONSTANT_BUFFER_ADDR_LOWER_SHIFTED6(0)",
        "CONSTANT_BUFFER_ADDR_UPPER_SHIFTED6(0)",
        "RELEASE_ENABLE(0)",
        "RELEASE_STRUCTURE_SIZE(0)",
        "RELEASE_MEMBAR_TYPE(0)",
        "RELEASE_SEMAPHORE0_ADDR_LOWER",
        "RELEASE_SEMAPHORE0_ADDR_UPPER",
        "RELEASE_SEMAPHORE0_PAYLOAD_LOWER",
        "DEPENDENT_QMD_ENABLE(0)",
        "DEPENDENT_QMD_ACTION(0)",
        "DEPENDENT_QMD_PREFETCH(0)",
        "DEPENDENT_QMD0_POINTER",
        # Chained launches: a grid's CTAs may signal its dependent early (pre-exit),
        # which then waits for the grid's completion on a latch.
        "ENABLE_PROGRAM_PRE_EXIT",
        "ARRIVE_AT_LATCH_VALID",
        "ARRIVE_AT_LATCH_ID",
        "WAIT_ON_LATCH_VALID",
        "WAIT_ON_LATCH_ID",
        "LATCH_ACQUIRE_INVALIDATE_SHADER_DATA_CACHE",
        "LATCH_ACQUIRE_INVALIDATE_TEXTURE_DATA_CACHE",
        # A grid of thread-block clusters (QMD_TYPE GRID_GPC_CGA): the CTAs of a cluster,
        # all on one GPC.
        "GPC_CGA_WIDTH",
        "GPC_CGA_HEIGHT",
        "GPC_CGA_DEPTH",
    )),
)

_COMPUTE_METHODS = (
    "SET_OBJECT",
    "WAIT_FOR_IDLE",
    "SET_SHADER_SHARED_MEMORY_WINDOW_A",
    "SET_SHADER_SHARED_MEMORY_WINDOW_B",
    "SEND_PCAS_A",
    "SEND_SIGNALING_PCAS2_B",
    "SET_SHADER_LOCAL_MEMORY_WINDOW_A",
    "SET_SHADER_LOCAL_MEMORY_WINDOW_B",
)
_COMPUTE_FIELDS = (
    "SET_OBJECT_CLASS_ID",
    "SET_OBJECT_ENGINE_ID",
    "WAIT_FOR_IDLE_V",
    "SET_SHADER_SHARED_MEMORY_WINDOW_A_BASE_ADDRESS_UPPER",
    "SET_SHADER_SHARED_MEMORY_WINDOW_B_BASE_ADDRESS",
    "SEND_PCAS_A_QMD_ADDRESS_SHIFTED8",
    "SEND_SIGNALING_PCAS2_B_PCAS_ACTION",
    "SET_SHADER_LOCAL_MEMORY_WINDOW_A_BASE_ADDRESS_UPPER",
    "SET_SHADER_LOCAL_MEMORY_WINDOW_B_BASE_ADDRESS",
)
_SEMAPHORE_METHODS = ("SEM_ADDR_LO", "SEM_ADDR_HI", "SEM_PAYLOAD_LO", "SEM_PAYLOAD_HI",
                      "SEM_EXECUTE")
_GPFIFO_FIELDS = (
    "GP_ENTRY0_FETCH",
    "GP_ENTRY0_GET",
    "GP_ENTRY1_GET_HI",
    "GP_ENTRY1_LEVEL",
    "GP_ENTRY1_LENGTH",
    "GP_ENTRY1_SYNC",
)
# The pushbuffer word formats belong to the PBDMA and are the same for every
# channel class; clc56f.h spells them out, clc86f.h (this release) does not.
_METHOD_HEADER_FIELDS = (
    "DMA_INCR_ADDRESS", "DMA_INCR_SUBCHANNEL", "DMA_INCR_COUNT", "DMA_INCR_OPCODE",
    "DMA_NONINCR_ADDRESS", "DMA_NONINCR_SUBCHANNEL", "DMA_NONINCR_COUNT", "DMA_NONINCR_OPCODE",
    "DMA_IMMD_ADDRESS", "DMA_IMMD_SUBCHANNEL", "DMA_IMMD_DATA", "DMA_IMMD_OPCODE",
)
_COPY_METHODS = (
    "SET_SEMAPHORE_A", "SET_SEMAPHORE_B", "SET_SEMAPHORE_PAYLOAD", "SET_SEMAPHORE_PAYLOAD_UPPER",
    "LAUNCH_DMA", "OFFSET_IN_UPPER", "OFFSET_IN_LOWER", "OFFSET_OUT_UPPER", "OFFSET_OUT_LOWER",
    "LINE_LENGTH_IN", "LINE_COUNT",
)
_COPY_FIELDS = (
    "SET_SEMAPHORE_A_UPPER", "SET_SEMAPHORE_B_LOWER", "SET_SEMAPHORE_PAYLOAD_PAYLOAD",
    "SET_SEMAPHORE_PAYLOAD_UPPER_PAYLOAD",
    "LAUNCH_DMA_DATA_TRANSFER_TYPE", "LAUNCH_DMA_FLUSH_ENABLE", "LAUNCH_DMA_FLUSH_TYPE",
    "LAUNCH_DMA_SEMAPHORE_TYPE", "LAUNCH_DMA_INTERRUPT_TYPE", "LAUNCH_DMA_SRC_MEMORY_LAYOUT",
    "LAUNCH_DMA_DST_MEMORY_LAYOUT", "LAUNCH_DMA_MULTI_LINE_ENABLE", "LAUNCH_DMA_REMAP_ENABLE",
    "LAUNCH_DMA_SRC_TYPE", "LAUNCH_DMA_DST_TYPE", "LAUNCH_DMA_SEMAPHORE_PAYLOAD_SIZE",
    "OFFSET_IN_UPPER_UPPER", "OFFSET_IN_LOWER_VALUE", "OFFSET_OUT_UPPER_UPPER",
    "OFFSET_OUT_LOWER_VALUE", "LINE_LENGTH_IN_VALUE", "LINE_COUNT_VALUE",
)
CLASS_WANTED = (
    ClassWanted("NVC7C0", "clc7c0.h", "AMPERE_COMPUTE_B", _COMPUTE_METHODS, _COMPUTE_FIELDS),
    ClassWanted("NVCBC0", "clcbc0.h", "HOPPER_COMPUTE_A", _COMPUTE_METHODS, _COMPUTE_FIELDS),
    ClassWanted(
        "NVC56F", "clc56f.h", "AMPERE_CHANNEL_GPFIFO_A", ("SET_OBJECT", *_SEMAPHORE_METHODS),
        ("SET_OBJECT_NVCLASS", "SEM_ADDR_LO_OFFSET", "SEM_ADDR_HI_OFFSET", "SEM_PAYLOAD_LO_PAYLOAD",
         "SEM_PAYLOAD_HI_PAYLOAD", "SEM_EXECUTE_OPERATION", "SEM_EXECUTE_RELEASE_WFI",
         "SEM_EXECUTE_PAYLOAD_SIZE", "SEM_EXECUTE_RELEASE_TIMESTAMP")
        + _GPFIFO_FIELDS + _METHOD_HEADER_FIELDS,
        ("NUMBER_OF_SUBCHANNELS", "GP_ENTRY__SIZE"),
    ),
    ClassWanted(
        "NVC86F", "clc86f.h", "HOPPER_CHANNEL_GPFIFO_A", _SEMAPHORE_METHODS,
        ("SEM_ADDR_LO_OFFSET", "SEM_ADDR_HI_OFFSET", "SEM_EXECUTE_OPERATION",
         "SEM_EXECUTE_RELEASE_WFI", "SEM_EXECUTE_PAYLOAD_SIZE", "SEM_EXECUTE_RELEASE_TIMESTAMP")
        + _GPFIFO_FIELDS,
        ("GP_ENTRY__SIZE",),
    ),
    # The copy engine Bob reads the arena back with (and writes large tensors through).
    ClassWanted("NVC8B5", "clc8b5.h", "HOPPER_DMA_COPY_A", _COPY_METHODS, _COPY_FIELDS),
)


# -- reading a header ------------------------------------------------------


@dataclass(frozen=True)
class Define:
    """One `#define NAME VALUE` line, its value classified."""

    name: str
    kind: str  # "bits" | "indexed" | "number" | "other"
    numbers: tuple[int, ...]  # bits: (high, low); indexed: (high0, low0, stride); number: (n,)


def _strip_parens(text: str) -> str:
    while text.startswith("(") and text.endswith(")"):
        text = text[1:-1]
    return text


def _parse_bits(text: str) -> tuple[int, int] | None:
    """`31:2` or `MW(31:2)`: a (high, low) bit range."""
    if text.startswith("MW(") and text.endswith(")"):
        text = text[3:-1]
    high, colon, low = text.partition(":")
    if colon and high.isdigit() and low.isdigit():
        return int(high), int(low)
    return None


def _parse_indexed_end(text: str) -> tuple[int, int] | None:
    """`(1055+(i)*64)`: base 1055, stride 64."""
    text = _strip_parens(text)
    base, plus, rest = text.partition("+(i)*")
    if plus and base.isdigit() and rest.isdigit():
        return int(base), int(rest)
    return None


def _parse_number(text: str) -> int | None:
    text = _strip_parens(text)
    if text.lower().startswith("0x"):
        try:
            return int(text, 16)
        except ValueError:
            return None
    return int(text) if text.isdigit() else None


def classify(name: str, value: str) -> Define:
    bits = _parse_bits(value)
    if bits is not None:
        return Define(name, "bits", bits)
    if value.startswith("MW(") and value.endswith(")"):
        high_text, colon, low_text = value[3:-1].partition("):(")
        high = _parse_indexed_end(high_text + ")") if colon else None
        low = _parse_indexed_end("(" + low_text) if colon else None
        if high is not None and low is not None and high[1] == low[1]:
            return Define(name, "indexed", (high[0], low[0], high[1]))
    number = _parse_number(value)
    if number is not None:
        return Define(name, "number", (number,))
    return Define(name, "other", ())


def read_defines(path: Path) -> dict[str, Define]:
    """Every #define of a header, by name, in the header's order."""
    defines: dict[str, Define] = {}
    for line in path.read_text().splitlines():
        words = line.split(None, 2)
        if len(words) < 3 or words[0] != "#define":
            continue
        name, value = words[1], words[2].split("//")[0].strip()
        defines[name] = classify(name, value)
    return defines


# -- building the tables ---------------------------------------------------


def _values_of(defines: dict[str, Define], prefix: str, fields: list[str]) -> dict[str, int]:
    """The named values of `fields`: numbers whose name extends exactly one field.

    A value belongs to the longest field name it extends, so that
    SEM_EXECUTE_REDUCTION_FORMAT_SIGNED is a value of SEM_EXECUTE_REDUCTION_FORMAT,
    not of SEM_EXECUTE_REDUCTION.
    """
    all_fields = [
        name[len(prefix):].removesuffix("(i)") for name, d in defines.items()
        if name.startswith(prefix) and d.kind in ("bits", "indexed")
    ]
    wanted = {field.partition("(")[0] for field in fields}
    values: dict[str, int] = {}
    for name, define in defines.items():
        if not name.startswith(prefix) or define.kind != "number":
            continue
        short = name[len(prefix):]
        owners = [f for f in all_fields if short.startswith(f + "_")]
        if owners and max(owners, key=len) in wanted:
            values[short] = define.numbers[0]
    return values


def qmd_tables(spec: QmdWanted) -> tuple[dict[str, tuple[int, int]], dict[str, int]]:
    defines = read_defines(HEADERS / spec.header)
    found: dict[str, tuple[int, int]] = {}
    for wanted in spec.fields:
        base, paren, index_text = wanted.partition("(")
        if paren:
            define = defines.get(spec.prefix + base + "(i)")
            if define is None or define.kind != "indexed":
                raise SystemExit(f"{spec.header}: no indexed field {spec.prefix}{base}(i)")
            high0, low0, stride = define.numbers
            index = int(index_text.rstrip(")"))
            found[wanted] = (high0 + index * stride, low0 + index * stride)
        else:
            define = defines.get(spec.prefix + wanted)
            if define is None or define.kind != "bits":
                raise SystemExit(f"{spec.header}: no field {spec.prefix}{wanted}")
            found[wanted] = (define.numbers[0], define.numbers[1])
    fields = dict(sorted(found.items(), key=lambda item: (item[1][1], item[0])))
    return fields, _values_of(defines, spec.prefix, list(spec.fields))


def class_tables(spec: ClassWanted) -> tuple[int, dict[str, int], dict[str, tuple[int, int]],
                                             dict[str, int], dict[str, int]]:
    defines = read_defines(HEADERS / spec.header)
    prefix = spec.table + "_"
    number = defines.get(spec.class_name)
    if number is None or number.kind != "number":
        raise SystemExit(f"{spec.header}: no class number {spec.class_name}")
    methods: dict[str, int] = {}
    for name in spec.methods:
        define = defines.get(prefix + name)
        if define is None or define.kind != "number":
            raise SystemExit(f"{spec.header}: no method {prefix}{name}")
        methods[name] = define.numbers[0]
    fields: dict[str, tuple[int, int]] = {}
    for name in spec.fields:
        define = defines.get(prefix + name)
        if define is None or define.kind != "bits":
            raise SystemExit(f"{spec.header}: no field {prefix}{name}")
        fields[name] = (define.numbers[0], define.numbers[1])
    constants: dict[str, int] = {}
    for name in spec.constants:
        define = defines.get(prefix + name)
        if define is None or define.kind != "number":
            raise SystemExit(f"{spec.header}: no constant {prefix}{name}")
        constants[name] = define.numbers[0]
    values = _values_of(defines, prefix, list(spec.fields))
    return number.numbers[0], methods, fields, values, constants


# -- writing the module ----------------------------------------------------


def _dict_lines(name: str, annotation: str, items: dict, render) -> list[str]:
    lines = [f"{name}: {annotation} = {{"]
    lines += [f'    "{key}": {render(value)},' for key, value in items.items()]
    lines.append("}")
    return lines


def _bits(value: tuple[int, int]) -> str:
    return f"({value[0]}, {value[1]})"


def _hex(value: int) -> str:
    return f"0x{value:x}"


def render() -> str:
    headers = sorted({s.header for s in QMD_WANTED} | {s.header for s in CLASS_WANTED})
    lines = [
        '"""NVIDIA field tables for the command-stream backend. GENERATED: do not edit.',
        "",
        "Written by tools/gen_nv_tables.py from the vendored headers in",
        "src/bob/backends/nv/headers/ (sha256 below); re-run it after changing a header.",
        "A field is (high bit, low bit), inclusive, as NVIDIA writes MW(high:low); QMD bits",
        "count from bit 0 of the record's first little-endian 32-bit word.",
        "",
    ]
    for header in headers:
        digest = hashlib.sha256((HEADERS / header).read_bytes()).hexdigest()
        lines.append(f"    {header:<12} {digest}")
    lines += ['"""', "", "from __future__ import annotations", "", "Bits = tuple[int, int]"]
    for spec in QMD_WANTED:
        fields, values = qmd_tables(spec)
        lines += ["", f"# {spec.header}: {spec.prefix}*"]
        lines += _dict_lines(f"{spec.table}_FIELDS", "dict[str, Bits]", fields, _bits)
        lines += _dict_lines(f"{spec.table}_VALUES", "dict[str, int]", values, _hex)
    for spec in CLASS_WANTED:
        number, methods, fields, values, constants = class_tables(spec)
        lines += ["", f"# {spec.header}: {spec.class_name}, {spec.table}_*"]
        lines.append(f"{spec.class_name} = {_hex(number)}")
        lines += _dict_lines(f"{spec.table}_METHODS", "dict[str, int]", methods, _hex)
        lines += _dict_lines(f"{spec.table}_FIELDS", "dict[str, Bits]", fields, _bits)
        lines += _dict_lines(f"{spec.table}_VALUES", "dict[str, int]", values, _hex)
        if constants:
            lines += _dict_lines(f"{spec.table}_CONSTANTS", "dict[str, int]", constants, str)
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="compare with the checked-in module instead of writing it")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if OUTPUT.read_text() != text:
            print(f"{OUTPUT} is stale: run python tools/gen_nv_tables.py", file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(text)
    print(f"wrote {OUTPUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
