"""``nv-sim``: run a plan from its encoded command stream alone, on the CPU.

    backend = NvSimBackend(plan)            # encodes the plan, runs the set-up entry
    backend.write_tensor("input", record)
    backend.run(range(plan.submission_count))

The simulator is a small GPU channel: it walks GPFIFO entries, decodes their
pushbuffer words and the QMDs they dispatch with the independent decoder, and
takes from the plan only what a host knows: which region sits at which
program address (the reference kernels are keyed by name), each region's
parameter list (to read constant buffer 0, the parameter-block bytes in the
program component) and the semaphore value each submission must reach. Which
kernel runs, in what order, with which arguments, comes from the bytes; the
kernel runs on the arena. Semaphore releases (the
submissions' from the pushbuffer, the launches' from their QMDs) are written
into the semaphore component and logged in ``releases`` (the latest
``LOG_LIMIT``, as ``launched`` keeps the latest kernels run).

A chained submission's pushbuffer dispatches only its first QMD; each later
one runs because its predecessor names it as dependent QMD 0 (action
QMD_SCHEDULE), when the predecessor completes, as the compute engine does.
The chain is walked with the decoder's ``follow_chain`` before anything runs:
a pointer that is not at a QMD of the table, or a chain that comes back on
itself, is refused in one line. ``Launched.predecessor`` says which QMD
scheduled a launch (None: the pushbuffer's SEND_PCAS).

What the GPU needs that a reference kernel does not is checked all the same:
each launch's driver area (constant bank 0 below the parameters) must carry
the QMD's block and grid and the memory windows the set-up segment set.

Channel state persists across ``run`` calls, as on a GPU: GPFIFO entry 0 (the
set-up) runs once, when the backend opens; ``run(submissions)`` then, as the
``nv`` backend does, zeroes each submission's semaphore slot, runs entry s + 1
and checks that the slot holds the submission's value once the entry is done.
"""

from __future__ import annotations

import struct
from collections import deque
from dataclasses import dataclass

import numpy as np

from bob.backends.base import Patch
from bob.backends.cpu import HostArenaBackend, Kernel, kernel_arguments
from bob.backends.nv.decoder import (
    TABLES,
    DecodedQmd,
    DecodeError,
    GpEntry,
    MethodCall,
    decode_driver_area,
    decode_gpfifo,
    decode_segment,
    follow_chain,
)
from bob.backends.nv.encoder import SETUP_ENTRIES, EncodedProgram, encode
from bob.errors import BackendUnavailable, RunFailure
from bob.plan.certificate import CertifiedPlan
from bob.plan.model import Plan, Region, Scalar
from bob.plan.placement import argument_bytes_end, decode_parameter_block

WORD_BYTES = 4
WORD_BITS = 32
SEMAPHORE_BYTES = 8
LOG_LIMIT = 4096  # releases and launches kept for inspection (the latest)


class NvSimError(RunFailure):
    """The encoded stream did something the simulated channel cannot do; says what and where."""


@dataclass(frozen=True)
class Release:
    """One semaphore write: by the pushbuffer ("host") or a QMD on completion ("qmd")."""

    source: str
    address: int
    value: int


@dataclass(frozen=True)
class Launched:
    """One kernel the simulator ran, as it found it in the bytes."""

    qmd_address: int
    region: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    arguments: dict[str, int | np.float32]
    predecessor: int | None = None  # the QMD whose completion scheduled it (chained)


def _reference_kernels() -> dict[str, Kernel]:
    try:
        from bob.kernels.sets import reference_kernels
    except ImportError as error:
        raise BackendUnavailable(
            f"nv-sim needs the reference kernels (bob.kernels.reference): {error}"
        ) from None
    return reference_kernels()


class NvSimBackend(HostArenaBackend):
    name = "nv-sim"

    def __init__(self, plan: Plan | CertifiedPlan, kernels: dict[str, Kernel] | None = None):
        super().__init__(plan)
        plan = self.plan
        self.kernels = _reference_kernels() if kernels is None else kernels
        self.encoded: EncodedProgram = encode(self.certified)
        self._regions = self._region_table(plan)
        self._components = {
            c.name: (c.base, bytearray(c.data)) for c in self.encoded.components
            if c.base is not None
        }
        self._entries = decode_gpfifo(self.encoded.gpfifo.data, self.encoded.host_class)
        if len(self._entries) != SETUP_ENTRIES + plan.submission_count:
            raise NvSimError(f"{len(self._entries)} GPFIFO entries for "
                             f"{plan.submission_count} submissions")
        self._bindings: dict[int, int] = {}
        self._host: dict[str, MethodCall] = {}
        self._compute: dict[str, int] = {}
        self._pcas: int | None = None
        self.releases: deque[Release] = deque(maxlen=LOG_LIMIT)
        self.launched: deque[Launched] = deque(maxlen=LOG_LIMIT)
        for entry in self._entries[:SETUP_ENTRIES]:
            self._execute(entry)

    @staticmethod
    def _region_table(plan: Plan) -> dict[int, str]:
        table: dict[int, str] = {}
        for placed in plan.placed_regions:
            if placed.address in table:
                raise NvSimError(
                    f"regions {table[placed.address]!r} and {placed.name!r} share program "
                    f"address {placed.address:#x} (their code is empty), so the bytes cannot "
                    "tell their launches apart; give every retained region its code first"
                )
            table[placed.address] = placed.name
        return table

    # -- the host's side --------------------------------------------------------------
    def _run(self, submissions: range) -> None:
        for index in submissions:
            slot = self.encoded.submission_semaphore(index)
            self._write(slot, bytes(SEMAPHORE_BYTES))
            self._execute(self._entries[SETUP_ENTRIES + index])
            expected = self.plan.submissions[index].semaphore
            reached = self.semaphore(slot)
            if reached != expected:
                raise NvSimError(f"after submission {index} its semaphore at {slot:#x} holds "
                                 f"{reached}, not {expected}")

    def semaphore(self, address: int) -> int:
        """A submission's 64-bit semaphore slot."""
        (value,) = struct.unpack("<Q", self._read(address, SEMAPHORE_BYTES))
        return value

    def word(self, address: int) -> int:
        """One 32-bit word (the launch-progress word the QMDs release)."""
        (value,) = struct.unpack("<I", self._read(address, WORD_BYTES))
        return value

    def _carry_patches(self, launch_index: int, values: dict[str, Scalar],
                       patches: list[Patch]) -> None:
        """The patched words go into the program component, where the QMD's constant
        buffer 0 points: the simulator reads the bytes, as a GPU would."""
        block = self.plan.parameter_block_address(launch_index)
        for offset, word in patches:
            self._write(block + offset, word)

    # -- memory ---------------------------------------------------------------------------
    def _locate(self, address: int, size: int) -> tuple[bytearray, int]:
        for base, data in self._components.values():
            if base <= address and address + size <= base + len(data):
                return data, address - base
        raise NvSimError(f"[{address:#x}, {address + size:#x}) is in no mapped component")

    def _read(self, address: int, size: int) -> bytes:
        data, offset = self._locate(address, size)
        return bytes(data[offset:offset + size])

    def _write(self, address: int, payload: bytes) -> None:
        data, offset = self._locate(address, len(payload))
        data[offset:offset + len(payload)] = payload

    # -- the channel ------------------------------------------------------------------------
    def _execute(self, entry: GpEntry) -> None:
        raw = self._read(entry.address, WORD_BYTES * entry.words)
        words = struct.unpack(f"<{entry.words}I", raw)
        for call in decode_segment(words, entry.address, self.encoded.host_class, self._bindings):
            try:
                self._method(call)
            except NvSimError as error:
                raise NvSimError(f"GPFIFO entry {entry.index}, {call.class_name}.{call.name} at "
                                 f"{call.address:#x}: {error}") from None

    def _method(self, call: MethodCall) -> None:
        if call.name == "SET_OBJECT":
            if self._bindings[call.subchannel] != self.encoded.compute_class:
                raise NvSimError(f"binds class {self._bindings[call.subchannel]:#x}; this "
                                 f"channel runs {self.encoded.compute_class:#x}")
        elif call.class_name == TABLES.classes[self.encoded.host_class].name:
            self._host_method(call)
        else:
            self._compute_method(call)

    def _host_method(self, call: MethodCall) -> None:
        if call.name in ("SEM_ADDR_LO", "SEM_ADDR_HI", "SEM_PAYLOAD_LO", "SEM_PAYLOAD_HI"):
            self._host[call.name] = call
            return
        if call.name != "SEM_EXECUTE":
            raise NvSimError("a host method the simulator does not implement")
        operation = call.field("OPERATION").value_name
        if operation != "RELEASE":
            raise NvSimError(f"semaphore operation {operation}; only RELEASE is simulated")
        for name in ("SEM_ADDR_LO", "SEM_ADDR_HI", "SEM_PAYLOAD_LO", "SEM_PAYLOAD_HI"):
            if name not in self._host:
                raise NvSimError(f"SEM_EXECUTE before {name}")
        # SEM_ADDR_LO_OFFSET holds address bits 31:2 in place, SEM_ADDR_HI_OFFSET bits 63:32.
        address = (self._host["SEM_ADDR_LO"].field("OFFSET").in_place
                   | self._host["SEM_ADDR_HI"].field("OFFSET").value << WORD_BITS)
        size = call.field("PAYLOAD_SIZE").value_name
        low, high = self._host["SEM_PAYLOAD_LO"].data, self._host["SEM_PAYLOAD_HI"].data
        if size == "32BIT":
            value = low
            self._write(address, struct.pack("<I", value))
        elif size == "64BIT":
            value = low | high << WORD_BITS
            self._write(address, struct.pack("<Q", value))
        else:
            raise NvSimError(f"semaphore payload size {size}")
        # RELEASE_WFI: the simulator runs launches to completion in order, so every
        # earlier launch is idle already.
        self.releases.append(Release("host", address, value))

    def _compute_method(self, call: MethodCall) -> None:
        if call.name in ("SET_SHADER_SHARED_MEMORY_WINDOW_A", "SET_SHADER_SHARED_MEMORY_WINDOW_B",
                         "SET_SHADER_LOCAL_MEMORY_WINDOW_A", "SET_SHADER_LOCAL_MEMORY_WINDOW_B"):
            part = "BASE_ADDRESS_UPPER" if call.name.endswith("_A") else "BASE_ADDRESS"
            self._compute[call.name] = call.field(part).value
        elif call.name == "WAIT_FOR_IDLE":
            pass  # every launch has completed before the next method
        elif call.name == "SEND_PCAS_A":
            self._pcas = call.field("QMD_ADDRESS_SHIFTED8").unshifted
        elif call.name == "SEND_SIGNALING_PCAS2_B":
            action = call.field("PCAS_ACTION").value_name
            if action != "INVALIDATE_COPY_SCHEDULE":
                raise NvSimError(f"PCAS action {action}; only INVALIDATE_COPY_SCHEDULE is "
                                 "simulated")
            if self._pcas is None:
                raise NvSimError("SEND_SIGNALING_PCAS2_B without SEND_PCAS_A")
            qmd_address, self._pcas = self._pcas, None
            self._launch(qmd_address)
        else:
            raise NvSimError("a compute method the simulator does not implement")

    def _launch(self, qmd_address: int) -> None:
        """Run the QMD the pushbuffer dispatched, then each dependent QMD in turn."""
        for window in ("SET_SHADER_SHARED_MEMORY_WINDOW_A", "SET_SHADER_LOCAL_MEMORY_WINDOW_A"):
            if window not in self._compute:
                raise NvSimError(f"a launch before the set-up ({window} never written)")
        try:
            chain = follow_chain(self.encoded, qmd_address, self._read)
        except DecodeError as error:
            raise NvSimError(str(error)) from None
        predecessor = None
        for address, qmd in chain:
            self._run_qmd(address, qmd, predecessor)
            predecessor = address

    def _run_qmd(self, qmd_address: int, qmd: DecodedQmd, predecessor: int | None) -> None:
        compute_class = self.encoded.compute_class
        dispatch = qmd.dispatch()
        if dispatch.major_version != int(qmd.version[:2]):
            raise NvSimError(f"QMD at {qmd_address:#x} says major version "
                             f"{dispatch.major_version}, class {compute_class:#x} reads "
                             f"V{qmd.version}")
        region_name = self._regions.get(dispatch.program_address)
        if region_name is None:
            raise NvSimError(f"QMD at {qmd_address:#x}: program address "
                             f"{dispatch.program_address:#x} is no region's")
        region = self.plan.region(region_name)
        if 0 not in dispatch.constant_buffers:
            raise NvSimError(f"QMD at {qmd_address:#x}: constant buffer 0 is not valid")
        address, size = dispatch.constant_buffers[0]
        needed = argument_bytes_end(self.plan.target, region.params)
        if size < needed:
            raise NvSimError(f"QMD at {qmd_address:#x}: constant buffer 0 is {size} bytes; "
                             f"{region_name} reads {needed}")
        block = self._read(address, size)
        self._check_driver_area(qmd_address, block, dispatch.grid, dispatch.block,
                                region.dynamic_shared_bytes)
        self._check_cluster(qmd_address, block, region, dispatch.grid, dispatch.cluster)
        self._check_shared_memory(qmd_address, region_name, dispatch.shared_memory,
                                  region.shared_window_bytes)
        arguments = kernel_arguments(decode_parameter_block(self.plan.target, region, block))
        arguments["grid.x"] = dispatch.grid[0]  # as the QMD says: a block-per-row kernel's rows
        if region_name not in self.kernels:
            raise NvSimError(f"no kernel for region {region_name!r}")
        self.kernels[region_name](self.memory, arguments)
        self.launched.append(Launched(qmd_address, region_name, dispatch.grid, dispatch.block,
                                      arguments, predecessor))
        for release in dispatch.releases:
            if release.structure != "SEMAPHORE_ONE_WORD":
                raise NvSimError(f"QMD release structure {release.structure}; only one-word "
                                 "releases are simulated")
            self._write(release.address, struct.pack("<I", release.payload))
            self.releases.append(Release("qmd", release.address, release.payload))

    @staticmethod
    def _check_cluster(qmd_address: int, block: bytes, region: Region,
                       grid: tuple[int, int, int], cluster: tuple[int, int, int] | None) -> None:
        """A cluster region runs as a grid of clusters (the QMD's GPC clusters, whole ones),
        and its driver area says so, as compiled code reads it; other regions run alone."""
        where = f"QMD at {qmd_address:#x}"
        if cluster is None:
            if region.cluster_slices is not None:
                raise NvSimError(f"{where}: cluster region {region.name} launched as a grid "
                                 "of CTAs")
            return
        if region.cluster_slices is None:
            raise NvSimError(f"{where}: {region.name} launched in clusters of {cluster}")
        if any(size % ctas for size, ctas in zip(grid, cluster, strict=True)):
            raise NvSimError(f"{where}: grid {grid} is not whole clusters of {cluster}")
        area = decode_driver_area(block)
        clusters = tuple(size // ctas for size, ctas in zip(grid, cluster, strict=True))
        expected = {
            "the explicit-cluster flag": (area.explicit_cluster, 1),
            "CTAs per cluster": (area.cluster, cluster),
            "their reciprocals": (area.cluster_reciprocals,
                                  tuple(float(np.float32(1.0 / ctas)) for ctas in cluster)),
            "clusters": (area.clusters, clusters),
            "CTAs of a cluster": (area.cluster_ctas, cluster[0] * cluster[1] * cluster[2]),
        }
        for what, (found, wanted) in expected.items():
            if found != wanted:
                raise NvSimError(f"{where}: constant buffer 0's driver area holds {what} "
                                 f"{found}, the cluster launch has {wanted}")

    @staticmethod
    def _check_shared_memory(qmd_address: int, region_name: str, granted: int,
                             needed: int) -> None:
        """A block must be given the shared memory its region uses, dynamic bytes too."""
        if granted < needed:
            raise NvSimError(f"QMD at {qmd_address:#x}: {granted} bytes of shared memory for "
                             f"{region_name}, which uses {needed}")

    def _window(self, name: str) -> int:
        """A window base the set-up set: A holds bits 63:32, B bits 31:0."""
        return self._compute[f"{name}_A"] << WORD_BITS | self._compute[f"{name}_B"]

    def _check_driver_area(self, qmd_address: int, block: bytes,
                           grid: tuple[int, int, int], dims: tuple[int, int, int],
                           dynamic_shared: int) -> None:
        """Compiled code reads blockDim, gridDim, the windows and its dynamic shared memory
        from constant bank 0."""
        area = decode_driver_area(block)
        expected = {
            "blockDim": (area.block, dims),
            "gridDim": (area.grid, grid),
            "dynamic shared bytes": (area.dynamic_shared, dynamic_shared),
            "shared window": (area.shared_window, self._window("SET_SHADER_SHARED_MEMORY_WINDOW")),
            "local window": (area.local_window, self._window("SET_SHADER_LOCAL_MEMORY_WINDOW")),
        }
        for what, (found, wanted) in expected.items():
            if found != wanted:
                raise NvSimError(f"QMD at {qmd_address:#x}: constant buffer 0's driver area "
                                 f"holds {what} {found}, the launch has {wanted}")
