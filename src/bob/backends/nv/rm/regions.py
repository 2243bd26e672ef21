"""Bob's compiled sm_90 regions, carried as a file to a machine without NVRTC.

    python -m bob.backends.nv.rm.probe --export-regions build/nv_regions_sm90.json

writes the code, register count and shared memory of each region compiled
here; ``load_regions(path)`` reads them back (and, without a path, compiles
with NVRTC). The file starts with its format name and version.
"""

from __future__ import annotations

import json
from pathlib import Path

from bob.errors import BadInput
from bob.kernels import signatures as sig
from bob.plan.model import Region

FORMAT = "bob-nv-regions"
VERSION = 1
ARCH = "sm_90"


def export_regions(path: str | Path) -> dict[str, Region]:
    from bob.kernels.cuda.compile import compiled_regions

    regions = compiled_regions(ARCH)
    document = {
        "format": FORMAT, "version": VERSION, "arch": ARCH,
        "regions": {name: {"code": region.code.hex(), "registers": region.registers,
                           "shared_bytes": region.shared_bytes}
                    for name, region in regions.items()},
    }
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(document, indent=1))
    return regions


def load_regions(path: str | Path | None = None) -> dict[str, Region]:
    if path is None:
        from bob.kernels.cuda.compile import compiled_regions

        return compiled_regions(ARCH)
    try:
        document = json.loads(Path(path).read_text())
    except (OSError, ValueError) as error:
        raise BadInput(f"{path}: not a readable regions file ({error})") from None
    if document.get("format") != FORMAT or document.get("version") != VERSION:
        raise BadInput(f"{path}: expected a {FORMAT} file version {VERSION}; "
                       "re-export it with --export-regions")
    if document.get("arch") != ARCH:
        raise BadInput(f"{path}: regions for {document.get('arch')}, not {ARCH}")
    return {name: sig.declared_region(name, bytes.fromhex(entry["code"]), entry["registers"],
                                      entry["shared_bytes"])
            for name, entry in document["regions"].items()}
