"""A minimal PNG writer (8-bit RGB), so plots need no plotting library."""

from __future__ import annotations

import struct
import zlib
from os import PathLike

import numpy as np

from bob.files import atomic_write

_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _chunk(kind: bytes, data: bytes) -> bytes:
    crc = zlib.crc32(kind + data) & 0xFFFFFFFF
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)


def png_bytes(image: np.ndarray) -> bytes:
    """Encode an (height, width, 3) uint8 image."""
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
        raise ValueError("expected an (height, width, 3) uint8 image")
    height, width, _ = image.shape
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit truecolour
    rows = np.concatenate([np.zeros((height, 1), np.uint8), image.reshape(height, -1)], axis=1)
    return (_SIGNATURE + _chunk(b"IHDR", header)
            + _chunk(b"IDAT", zlib.compress(rows.tobytes(), 9)) + _chunk(b"IEND", b""))


def write_png(path: str | PathLike[str], image: np.ndarray) -> None:
    atomic_write(path, png_bytes(image))
