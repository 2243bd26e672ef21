"""QMDs (queue meta data): the launch records the compute engine reads.

One class per QMD version behind one typed interface (``Qmd``), as Mesa NVK
does it. Every field write goes through ``Qmd.write``: it looks the field up
in the generated table (bit positions from NVIDIA's headers, never typed
here), refuses a value that does not fit or a field that would overlap one
already written, and keeps a log of what was set (``fields_set``) so tests and
listings can check every field against an independent decoder.

What a minimal dispatch sets, and why (Mesa NVK ``nak/qmd.rs``, tinygrad's
``ops_nv.py``, the raw Hopper notes):

- the version (major 3 or 4, minor 0); API_VISIBLE_CALL_LIMIT = NO_CHECK and
  SAMPLER_INDEX = INDEPENDENTLY, as NVK initialises every QMD;
- program address, grid, block, registers, barrier count, shared memory size
  and the SM shared-memory carve-out fields (MIN/MAX/TARGET);
- constant buffer 0 (the launch's parameter block): address, size, valid, and
  invalidate, because the host rewrites parameter blocks between runs;
- the texture and shader-data cache invalidations and CWD_MEMBAR_TYPE =
  L1_SYSMEMBAR that tinygrad (after CUDA) sets, so a launch sees what the host
  and earlier launches wrote and its own writes are visible when it completes;
- release semaphore 0 (one word, with a system membar) when the caller asks;
- dependent QMD 0 when the launch is chained: enable, action QMD_SCHEDULE
  (run the next QMD when this grid completes), prefetch, and the next QMD's
  address >> 8, as tinygrad's ``ops_nv.py`` links the QMDs of one queue;
- on V04, a grid of thread-block clusters (``set_cluster``): QMD_TYPE GRID_GPC_CGA and
  the cluster's CTAs along each axis in GPC_CGA_WIDTH/HEIGHT/DEPTH (a cluster's CTAs
  share one GPC); GRID_WIDTH/HEIGHT/DEPTH then count clusters, not CTAs (on the H200, a
  grid of clusters given its CTAs there ran that many clusters: C times the grid, each
  row of a cluster kernel updated by two clusters). The CUDA driver also fills the
  cluster's words of the driver area (encoder.cluster_area);
- on V04, the latched chain (``set_latched_chain``): the grid lets its CTAs
  schedule the dependent as they exit (ENABLE_PROGRAM_PRE_EXIT) and arrives at
  a latch when it completes; the dependent waits on that latch, invalidating
  the data caches as it acquires it. So the next grid's launch overlaps the
  last one's tail and still starts only after its writes (docs/BENCHMARKS.md;
  scheduling the dependent at the last CTA's launch without the latch gave
  different bytes every run, with it the same bytes).

Version quirks live on the classes below.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from bob.backends.nv import fields_generated as g
from bob.errors import BadInput

Bits = tuple[int, int]

# MIN/MAX/TARGET_SM_CONFIG_SHARED_MEM_SIZE hold a carve-out as (KiB / 4) + 1
# (Mesa NVK gv100_sm_config_smem_size: size / 4096 + 1; tinygrad writes 0x1a
# for Ampere's 100 KiB maximum).
SM_CONFIG_UNIT_KIB = 4
SM_CONFIG_BIAS = 1
MAX_REGISTERS = 255  # per thread, every architecture Bob targets
WORD_BITS = 32
# A dependent QMD pointer names a QMD the way SEND_PCAS_A does: its address >> 8
# (the header names the method's field ..._SHIFTED8; tinygrad writes the pointer
# so). The QMD fields themselves carry no shift in their names.
DEPENDENT_POINTER_SHIFT = 8

_SHIFTED = re.compile(r"_SHIFTED(\d+)(?:\(\d+\))?$")


class QmdFieldError(BadInput):
    """A QMD field write that cannot be encoded (a plan value the QMD cannot hold); the
    message names the field."""


def field_shift(name: str) -> int:
    """The shift a field's name declares: ``..._SHIFTED6(0)`` holds value >> 6."""
    match = _SHIFTED.search(name)
    return int(match.group(1)) if match else 0


@dataclass(frozen=True)
class SharedMemoryConfig:
    """The SM shared-memory carve-outs a launch asks for, in KiB."""

    minimum_kib: int
    maximum_kib: int
    target_kib: int


# Fields every Bob launch sets the same way in both versions: (field, the header's value name).
_COMMON_VALUES = (
    ("API_VISIBLE_CALL_LIMIT", "API_VISIBLE_CALL_LIMIT_NO_CHECK"),
    ("SAMPLER_INDEX", "SAMPLER_INDEX_INDEPENDENTLY"),
    ("INVALIDATE_TEXTURE_HEADER_CACHE", "INVALIDATE_TEXTURE_HEADER_CACHE_TRUE"),
    ("INVALIDATE_TEXTURE_SAMPLER_CACHE", "INVALIDATE_TEXTURE_SAMPLER_CACHE_TRUE"),
    ("INVALIDATE_TEXTURE_DATA_CACHE", "INVALIDATE_TEXTURE_DATA_CACHE_TRUE"),
    ("INVALIDATE_SHADER_DATA_CACHE", "INVALIDATE_SHADER_DATA_CACHE_TRUE"),
    ("CWD_MEMBAR_TYPE", "CWD_MEMBAR_TYPE_L1_SYSMEMBAR"),
)


class Qmd:
    """One QMD record under construction. Subclasses are the QMD versions."""

    version: ClassVar[str]
    major_version: ClassVar[int]
    record_bytes: ClassVar[int]
    FIELDS: ClassVar[Mapping[str, Bits]]
    VALUES: ClassVar[Mapping[str, int]]
    # Where the versions name the same thing differently (each version's docstring says how).
    MINOR_VERSION_FIELD: ClassVar[str]
    VERSION_FIELDS: ClassVar[tuple[tuple[str, int | str], ...]]  # set by one version only
    GRID_FIELDS: ClassVar[tuple[str, str, str]]
    REGISTER_FIELD: ClassVar[str]
    CONSTANT_BUFFER_ADDRESS_FIELDS: ClassVar[tuple[str, str]]  # lower, upper
    RELEASE_FIELDS: ClassVar[tuple[str, str, str]]  # address lower, upper, payload
    RELEASE_VALUES: ClassVar[tuple[tuple[str, str], ...]]  # one-word, membar, enable
    DEPENDENT_POINTER_FIELD: ClassVar[str]
    DEPENDENT_VALUES: ClassVar[tuple[tuple[str, str], ...]]  # enable, action, prefetch
    LATCHES: ClassVar[bool] = False  # arrive/wait latches and program pre-exit (V04 on)
    CLUSTER_FIELDS: ClassVar[tuple[str, str, str] | None] = None  # a cluster's CTAs (V04 on)

    def __init__(self) -> None:
        self._record = 0
        self._masks: dict[str, int] = {}
        self._written: dict[str, int] = {}
        self._initialise()

    # -- the one masked write ------------------------------------------------
    def write(self, name: str, value: int) -> None:
        """Set field `name` to `value`, checking fit and overlap."""
        bits = self.FIELDS.get(name)
        if bits is None:
            raise QmdFieldError(
                f"QMD {self.version} has no field {name} in the generated table "
                "(tools/gen_nv_tables.py lists the fields Bob uses)"
            )
        high, low = bits
        width = high - low + 1
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << width:
            raise QmdFieldError(
                f"QMD {self.version} field {name} (bits {high}:{low}, {width} bits) "
                f"cannot hold {value!r}"
            )
        mask = ((1 << width) - 1) << low
        for other, other_mask in self._masks.items():
            if other != name and other_mask & mask:
                raise QmdFieldError(
                    f"QMD {self.version} field {name} (bits {high}:{low}) overlaps field "
                    f"{other}, already written"
                )
        self._record = (self._record & ~mask) | (value << low)
        self._masks[name] = mask
        self._written[name] = value

    def write_value(self, name: str, value_name: str) -> None:
        """Set field `name` to the header's named value `value_name` (a full name)."""
        if value_name not in self.VALUES:
            raise QmdFieldError(f"QMD {self.version} has no value {value_name} for field {name}")
        self.write(name, self.VALUES[value_name])

    def write_shifted(self, name: str, value: int, what: str) -> None:
        """Set a ``_SHIFTEDn`` field from an unshifted value that must be aligned."""
        shift = field_shift(name)
        if value % (1 << shift):
            raise QmdFieldError(
                f"QMD {self.version}: {what} {value:#x} is not {1 << shift}-byte aligned, "
                f"as field {name} requires"
            )
        self.write(name, value >> shift)

    def write_address(self, lower: str, upper: str, address: int, what: str) -> None:
        """Split an address over a LOWER/UPPER field pair (both with the same shift)."""
        shift = field_shift(lower)
        if field_shift(upper) != shift:
            raise QmdFieldError(f"QMD {self.version}: {lower} and {upper} shift differently")
        if address < 0 or address % (1 << shift):
            raise QmdFieldError(
                f"QMD {self.version}: {what} {address:#x} is not a {1 << shift}-byte aligned "
                f"address, as fields {lower}/{upper} require"
            )
        high, low = self.FIELDS[lower]
        lower_bits = high - low + 1
        shifted = address >> shift
        self.write(lower, shifted & ((1 << lower_bits) - 1))
        try:
            self.write(upper, shifted >> lower_bits)
        except QmdFieldError as error:
            raise QmdFieldError(f"{what} {address:#x} is too large: {error}") from None

    def read(self, name: str) -> int:
        high, low = self.FIELDS[name]
        return (self._record >> low) & ((1 << (high - low + 1)) - 1)

    @property
    def fields_set(self) -> dict[str, int]:
        """Every field written, with the value written, in order."""
        return dict(self._written)

    def to_bytes(self) -> bytes:
        return self._record.to_bytes(self.record_bytes, "little")

    # -- the typed interface -------------------------------------------------
    def _initialise(self) -> None:
        """Write the version and the fields every Bob launch sets the same way."""
        self.write("QMD_MAJOR_VERSION", self.major_version)
        self.write(self.MINOR_VERSION_FIELD, 0)
        for name, value in (*self.VERSION_FIELDS, *_COMMON_VALUES):
            if isinstance(value, str):
                self.write_value(name, value)
            else:
                self.write(name, value)

    def set_program_address(self, address: int) -> None:
        self.write_address("PROGRAM_ADDRESS_LOWER", "PROGRAM_ADDRESS_UPPER", address,
                           "program address")

    def set_grid(self, x: int, y: int, z: int) -> None:
        self._positive("grid", (x, y, z))
        for name, value in zip(self.GRID_FIELDS, (x, y, z), strict=True):
            self.write(name, value)

    def set_block(self, x: int, y: int, z: int) -> None:
        self._positive("block", (x, y, z))
        self.write("CTA_THREAD_DIMENSION0", x)
        self.write("CTA_THREAD_DIMENSION1", y)
        self.write("CTA_THREAD_DIMENSION2", z)

    def set_registers(self, count: int) -> None:
        self._check_registers(count)
        self.write(self.REGISTER_FIELD, count)

    def set_barriers(self, count: int) -> None:
        self.write("BARRIER_COUNT", count)

    def set_shared_memory(self, size: int, config: SharedMemoryConfig) -> None:
        """Shared memory per block in bytes and the SM carve-outs the launch needs."""
        if not config.minimum_kib <= config.target_kib <= config.maximum_kib:
            raise QmdFieldError(f"QMD {self.version}: carve-outs {config} are not ordered")
        if config.target_kib * 1024 < size:
            raise QmdFieldError(
                f"QMD {self.version}: shared memory {size} bytes exceeds the "
                f"{config.target_kib} KiB carve-out asked for"
            )
        self.write("SHARED_MEMORY_SIZE", size)
        self.write("MIN_SM_CONFIG_SHARED_MEM_SIZE", self._sm_config(config.minimum_kib))
        self.write("MAX_SM_CONFIG_SHARED_MEM_SIZE", self._sm_config(config.maximum_kib))
        self.write("TARGET_SM_CONFIG_SHARED_MEM_SIZE", self._sm_config(config.target_kib))

    def set_constant_buffer(self, index: int, address: int, size: int) -> None:
        self._check_bank(index)
        self.write_address(*self.CONSTANT_BUFFER_ADDRESS_FIELDS, address,
                           "constant buffer 0 address")
        self.write_shifted("CONSTANT_BUFFER_SIZE_SHIFTED4(0)", size, "constant buffer 0 size")
        self.write_value("CONSTANT_BUFFER_VALID(0)", "CONSTANT_BUFFER_VALID_TRUE")
        self.write_value("CONSTANT_BUFFER_INVALIDATE(0)", "CONSTANT_BUFFER_INVALIDATE_TRUE")

    def set_release_semaphore(self, address: int, payload: int) -> None:
        """A one-word release of `payload` at `address` when the grid completes."""
        self._check_release(address, payload)
        lower, upper, payload_field = self.RELEASE_FIELDS
        self.write_address(lower, upper, address, "release semaphore address")
        self.write(payload_field, payload)
        for name, value in self.RELEASE_VALUES:
            self.write_value(name, value)

    def set_latched_chain(self, arrive: int | None, wait: int | None) -> None:
        """Arrive at latch `arrive` on completion, with program pre-exit (this grid has a
        dependent); wait on latch `wait` before running (this grid is a dependent)."""
        if not self.LATCHES:
            raise QmdFieldError(f"QMD {self.version} has no latches: chain with dependent QMDs "
                                "alone")
        if arrive is not None:
            self._latch_id("ARRIVE_AT_LATCH", arrive)
            self.write_value("ENABLE_PROGRAM_PRE_EXIT", "ENABLE_PROGRAM_PRE_EXIT_TRUE")
        if wait is not None:
            self._latch_id("WAIT_ON_LATCH", wait)
            for cache in ("SHADER_DATA", "TEXTURE_DATA"):
                field = f"LATCH_ACQUIRE_INVALIDATE_{cache}_CACHE"
                self.write_value(field, f"{field}_TRUE")

    def set_cluster(self, x: int, y: int, z: int) -> None:
        """Launch the grid as thread-block clusters of x * y * z CTAs, each on one GPC; the
        grid (set_grid) is then counted in clusters."""
        if self.CLUSTER_FIELDS is None:
            raise QmdFieldError(f"QMD {self.version} has no thread-block clusters")
        self._positive("cluster", (x, y, z))
        self.write_value("QMD_TYPE", "QMD_TYPE_GRID_GPC_CGA")
        for name, value in zip(self.CLUSTER_FIELDS, (x, y, z), strict=True):
            self.write(name, value)

    def _latch_id(self, prefix: str, latch: int) -> None:
        if isinstance(latch, bool) or not isinstance(latch, int) or not 0 < latch < 1 << 32:
            raise QmdFieldError(f"QMD {self.version}: latch {latch!r} is not a 32-bit id above 0")
        self.write(f"{prefix}_VALID", 1)  # the header names no values for the valid bits
        self.write(f"{prefix}_ID", latch)

    def set_dependent_qmd(self, address: int) -> None:
        """Schedule the QMD at `address` when this grid completes (dependent QMD 0)."""
        if address <= 0:
            raise QmdFieldError(f"QMD {self.version}: dependent QMD address {address:#x} is not "
                                "an address")
        if address % (1 << DEPENDENT_POINTER_SHIFT):
            raise QmdFieldError(f"QMD {self.version}: dependent QMD at {address:#x} is not "
                                f"{1 << DEPENDENT_POINTER_SHIFT}-byte aligned")
        try:
            self.write(self.DEPENDENT_POINTER_FIELD, address >> DEPENDENT_POINTER_SHIFT)
        except QmdFieldError as error:
            raise QmdFieldError(f"dependent QMD address {address:#x} is too large: "
                                f"{error}") from None
        for name, value in self.DEPENDENT_VALUES:
            self.write_value(name, value)

    # -- shared checks ---------------------------------------------------------
    def _positive(self, what: str, dims: tuple[int, int, int]) -> None:
        if min(dims) < 1:
            raise QmdFieldError(f"QMD {self.version}: {what} {dims} has a zero dimension")

    def _check_registers(self, count: int) -> None:
        if not 1 <= count <= MAX_REGISTERS:
            raise QmdFieldError(
                f"QMD {self.version}: {count} registers per thread is outside 1..{MAX_REGISTERS}"
            )

    def _check_bank(self, index: int) -> None:
        if index != 0:
            raise QmdFieldError(
                f"QMD {self.version}: constant buffer {index} is not in the generated table; "
                "Bob passes parameters in bank 0 only"
            )

    def _check_release(self, address: int, payload: int) -> None:
        if address % 4:
            raise QmdFieldError(
                f"QMD {self.version}: one-word release semaphore at {address:#x} is not "
                "4-byte aligned"
            )
        if not 0 <= payload < 1 << WORD_BITS:
            raise QmdFieldError(
                f"QMD {self.version}: release payload {payload} does not fit one 32-bit word"
            )

    def _sm_config(self, kib: int) -> int:
        if kib < 0 or kib % SM_CONFIG_UNIT_KIB:
            raise QmdFieldError(
                f"QMD {self.version}: shared-memory carve-out {kib} KiB is not a multiple of "
                f"{SM_CONFIG_UNIT_KIB} KiB"
            )
        return kib // SM_CONFIG_UNIT_KIB + SM_CONFIG_BIAS


class QmdV03(Qmd):
    """QMD V03_00: 256 bytes, read by AMPERE_COMPUTE_B (sm_86).

    Quirks: the grid is CTA_RASTER_*, registers REGISTER_COUNT_V, releases
    RELEASE0..2_* with their own enable bits, dependent QMDs DEPENDENT_QMD0/1_*;
    addresses are unshifted.
    SM_GLOBAL_CACHING_ENABLE has no named values in the header: Bob writes 1,
    as NVK and tinygrad do for V03. The version's minor number is QMD_VERSION.
    """

    version = "V03_00"
    major_version = 3
    record_bytes = 256
    FIELDS = g.QMDV03_00_FIELDS
    VALUES = g.QMDV03_00_VALUES

    MINOR_VERSION_FIELD = "QMD_VERSION"
    VERSION_FIELDS = (("SM_GLOBAL_CACHING_ENABLE", 1),)
    GRID_FIELDS = ("CTA_RASTER_WIDTH", "CTA_RASTER_HEIGHT", "CTA_RASTER_DEPTH")
    REGISTER_FIELD = "REGISTER_COUNT_V"
    CONSTANT_BUFFER_ADDRESS_FIELDS = ("CONSTANT_BUFFER_ADDR_LOWER(0)",
                                      "CONSTANT_BUFFER_ADDR_UPPER(0)")
    RELEASE_FIELDS = ("RELEASE0_ADDRESS_LOWER", "RELEASE0_ADDRESS_UPPER", "RELEASE0_PAYLOAD_LOWER")
    RELEASE_VALUES = (
        ("RELEASE0_STRUCTURE_SIZE", "RELEASE0_STRUCTURE_SIZE_SEMAPHORE_ONE_WORD"),
        ("RELEASE0_MEMBAR_TYPE", "RELEASE0_MEMBAR_TYPE_FE_SYSMEMBAR"),
        ("RELEASE0_ENABLE", "RELEASE0_ENABLE_TRUE"),
    )
    DEPENDENT_POINTER_FIELD = "DEPENDENT_QMD0_POINTER"
    DEPENDENT_VALUES = (
        ("DEPENDENT_QMD0_ENABLE", "DEPENDENT_QMD0_ENABLE_TRUE"),
        ("DEPENDENT_QMD0_ACTION", "DEPENDENT_QMD0_ACTION_QMD_SCHEDULE"),
        ("DEPENDENT_QMD0_PREFETCH", "DEPENDENT_QMD0_PREFETCH_TRUE"),
    )


class QmdV04(Qmd):
    """QMD V04_00: 384 bytes, read by HOPPER_COMPUTE_A (sm_90).

    Quirks against V03: CTA_RASTER_* became GRID_*, REGISTER_COUNT_V became
    REGISTER_COUNT, QMD_VERSION became QMD_MINOR_VERSION; releases are
    RELEASE_ENABLE(i)/RELEASE_SEMAPHOREi_*, dependent QMDs
    DEPENDENT_QMD_ENABLE/ACTION/PREFETCH(i) with DEPENDENT_QMDi_POINTER; the
    constant buffer address is
    shifted by 6 (64-byte aligned); SM_GLOBAL_CACHING_ENABLE is gone.
    QMD_TYPE is new: Bob writes GRID_CTA, a plain grid of CTAs, because its
    zero value names a queue; NVK writes GRID_CTA from V05 on and leaves V04's
    at zero. Bob's choice runs on an H200 (the nv backend: docs/RAW-HOPPER.md). A
    cluster launch writes GRID_GPC_CGA instead (``set_cluster``).
    """

    version = "V04_00"
    major_version = 4
    record_bytes = 384
    LATCHES = True
    CLUSTER_FIELDS = ("GPC_CGA_WIDTH", "GPC_CGA_HEIGHT", "GPC_CGA_DEPTH")
    FIELDS = g.QMDV04_00_FIELDS
    VALUES = g.QMDV04_00_VALUES

    MINOR_VERSION_FIELD = "QMD_MINOR_VERSION"
    VERSION_FIELDS = (("QMD_TYPE", "QMD_TYPE_GRID_CTA"),)
    GRID_FIELDS = ("GRID_WIDTH", "GRID_HEIGHT", "GRID_DEPTH")
    REGISTER_FIELD = "REGISTER_COUNT"
    CONSTANT_BUFFER_ADDRESS_FIELDS = ("CONSTANT_BUFFER_ADDR_LOWER_SHIFTED6(0)",
                                      "CONSTANT_BUFFER_ADDR_UPPER_SHIFTED6(0)")
    RELEASE_FIELDS = ("RELEASE_SEMAPHORE0_ADDR_LOWER", "RELEASE_SEMAPHORE0_ADDR_UPPER",
                      "RELEASE_SEMAPHORE0_PAYLOAD_LOWER")
    RELEASE_VALUES = (
        ("RELEASE_STRUCTURE_SIZE(0)", "RELEASE_STRUCTURE_SIZE_SEMAPHORE_ONE_WORD"),
        ("RELEASE_MEMBAR_TYPE(0)", "RELEASE_MEMBAR_TYPE_FE_SYSMEMBAR"),
        ("RELEASE_ENABLE(0)", "RELEASE_ENABLE_TRUE"),
    )
    DEPENDENT_POINTER_FIELD = "DEPENDENT_QMD0_POINTER"
    DEPENDENT_VALUES = (
        ("DEPENDENT_QMD_ENABLE(0)", "DEPENDENT_QMD_ENABLE_TRUE"),
        ("DEPENDENT_QMD_ACTION(0)", "DEPENDENT_QMD_ACTION_QMD_SCHEDULE"),
        ("DEPENDENT_QMD_PREFETCH(0)", "DEPENDENT_QMD_PREFETCH_TRUE"),
    )


QMD_VERSIONS: dict[str, type[Qmd]] = {cls.version: cls for cls in (QmdV03, QmdV04)}
