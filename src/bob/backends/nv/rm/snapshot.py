"""Bob's copy kernels on the compute channel: a read-back's snapshot in video memory.

The kernels (``bob.kernels.cuda.snapshot``: NVRTC's where it is installed, else Bob's
own images, in one shape) live in one runtime block of video memory below every plan,
beside the QMDs and constant banks of their launches::

    KERNELS_VA + 0             bob_copy_16's code, then bob_copy_4's (CODE_STRIDE apart)
    KERNELS_VA + QMDS_OFFSET   one QMD per copy of a snapshot (MAX_COPIES at most)
    KERNELS_VA + BANKS_OFFSET  each QMD's constant bank 0: the driver area, then
                               source, destination and count at the parameter base

Each QMD is built as a plan launch's is (``encoder.build_qmd``), with no release:
the runtime stream's segment that dispatches them ends with a release after
wait-for-idle. The QMDs and banks are written again only when a snapshot's copies
differ from the last one's (a steady training loop reads the same tensors every
time), and only once the GPU is past the snapshot that used them.
"""

from __future__ import annotations

import struct

from bob.backends.nv.encoder import ARCHITECTURES, Dispatch, build_qmd, driver_area
from bob.kernels.cuda.snapshot import THREADS, CopyKernel, choose, copy_kernels
from bob.plan.placement import TARGETS

from .addresses import KERNELS_VA
from .device import SUBMITTED_TARGET, RmDevice
from .memory import Allocation, allocate

CODE_STRIDE = 16 << 10
QMDS_OFFSET = 64 << 10
BANKS_OFFSET = 128 << 10
MAX_COPIES = 64
KERNELS_BYTES = 256 << 10
# Blocks per copy at most; a grid-stride loop covers the rest (the fewest past which more
# blocks copied no faster).
MAX_BLOCKS = 8704
COPY_ARGUMENTS = struct.Struct("<QQQ")

Copy = tuple[int, int, int]  # (source, destination, bytes) between GPU addresses


class SnapshotKernels:
    """The copy kernels uploaded once, and the QMDs of the last snapshot's copies."""

    def __init__(self, device: RmDevice):
        self.kernels: dict[str, CopyKernel] = copy_kernels(SUBMITTED_TARGET)
        self.target = TARGETS[SUBMITTED_TARGET]
        self.stride = self.target.qmd_stride_bytes
        self.block: Allocation = allocate(device, KERNELS_BYTES, location="vidmem",
                                          gpu_va=KERNELS_VA, name="copy kernels")
        self.code_address: dict[str, int] = {}
        for index, (entry, copy) in enumerate(self.kernels.items()):
            if len(copy.kernel.code) > CODE_STRIDE:
                raise ValueError(f"{entry}'s code is {len(copy.kernel.code)} bytes, more than "
                                 f"the {CODE_STRIDE} its slot holds")
            self.block.write(index * CODE_STRIDE, copy.kernel.code)
            self.code_address[entry] = KERNELS_VA + index * CODE_STRIDE
        self.written: tuple[Copy, ...] = ()  # the copies the QMDs and banks hold now

    def entry_at(self, program_address: int) -> CopyKernel:
        """The kernel whose code starts at `program_address`."""
        for entry, address in self.code_address.items():
            if address == program_address:
                return self.kernels[entry]
        raise ValueError(f"no copy kernel's code starts at {program_address:#x}")

    def qmd_addresses(self, count: int) -> list[int]:
        return [KERNELS_VA + QMDS_OFFSET + index * self.stride for index in range(count)]

    def write(self, copies: tuple[Copy, ...]) -> list[int]:
        """The QMDs and banks of `copies` (the caller has waited until the GPU is past any
        snapshot that used them); the QMDs' addresses, in order."""
        if not 0 < len(copies) <= MAX_COPIES:
            raise ValueError(f"a snapshot is 1 to {MAX_COPIES} copies, not {len(copies)}")
        arch = ARCHITECTURES[SUBMITTED_TARGET]
        bank_bytes = self.target.parameter_block_bytes
        for index, (source, destination, size) in enumerate(copies):
            copy = self.kernels[choose(source, destination, size)]
            units = size // copy.unit
            blocks = max(1, min(MAX_BLOCKS, -(-units // THREADS)))
            bank_address = KERNELS_VA + BANKS_OFFSET + index * bank_bytes
            bank = bytearray(bank_bytes)
            area = driver_area((THREADS, 1, 1), (blocks, 1, 1))
            bank[:len(area)] = area
            COPY_ARGUMENTS.pack_into(bank, copy.kernel.parameter_base, source, destination,
                                     units)
            qmd = build_qmd(arch, Dispatch(
                program_address=self.code_address[copy.entry], grid=(blocks, 1, 1),
                block=(THREADS, 1, 1), registers=copy.kernel.registers,
                shared_bytes=copy.kernel.shared_bytes,
                constant_buffer=(bank_address, bank_bytes), release=None))
            self.block.write(BANKS_OFFSET + index * bank_bytes, bytes(bank))
            self.block.write(QMDS_OFFSET + index * self.stride, qmd.to_bytes())
        self.written = copies
        return self.qmd_addresses(len(copies))

    def close(self) -> None:
        self.block.close()


__all__ = ["COPY_ARGUMENTS", "KERNELS_VA", "MAX_COPIES", "SnapshotKernels"]
