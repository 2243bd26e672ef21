"""ptxas's own code, re-encoded byte for byte: every instruction of Bob's NVRTC-compiled
kernels whose form is in bob.isa's subset decodes, encodes to the same 16 bytes
(control bits included), and prints as nvdisasm prints it. Forms outside the subset
are listed with their counts, not failed; the seed kernels must be covered whole."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from bob.isa import codec, oracle, table, text
from bob.kernels.cuda.cubin import Cubin
from isa_support import ARCHS, SEED_KERNELS, kernel_image, require_tool

GUARD = re.compile(r"^@!?U?P[T0-6] ")


def _survey(arch: str, entries: tuple[str, ...]) -> tuple[int, int, Counter, list[str]]:
    cubin = Cubin(kernel_image(arch))
    forms_table = table(arch)
    total = decoded = 0
    outside: Counter = Counter()
    failures: list[str] = []
    for entry in entries:
        code = cubin.kernel(entry).code
        want = oracle.nvdisasm_raw(code, arch)
        assert len(want) * 16 == len(code), f"{entry}: nvdisasm printed {len(want)} lines"
        for index in range(0, len(code), 16):
            total += 1
            raw = code[index:index + 16]
            expected = want[index // 16]
            try:
                instruction = codec.decode(raw, forms_table)
            except codec.NotInSubset:
                outside[GUARD.sub("", expected).split()[0]] += 1
                continue
            decoded += 1
            again = codec.encode(instruction, forms_table)
            if again != raw:
                failures.append(f"{entry}+0x{index:x}: {raw.hex()} re-encodes as {again.hex()}")
            got = text.render(instruction, forms_table, index)
            if got != expected:
                failures.append(f"{entry}+0x{index:x}: prints {got!r}, nvdisasm {expected!r}")
    return total, decoded, outside, failures


@pytest.mark.parametrize("arch", ARCHS)
def test_seed_kernels_re_encode_whole(arch):
    require_tool("nvdisasm")
    total, decoded, outside, failures = _survey(arch, SEED_KERNELS)
    forms = Counter()
    cubin = Cubin(kernel_image(arch))
    for entry in SEED_KERNELS:
        for instruction in codec.decode_program(cubin.kernel(entry).code, table(arch)):
            if isinstance(instruction, codec.Instruction):
                forms[instruction.form] += 1
    print(f"{arch} seed kernels: {decoded}/{total} instructions in the subset, "
          f"{len(forms)} forms; outside: {dict(outside) or 'none'}")
    assert not failures, "\n".join(failures[:20])
    assert decoded == total, f"seed instructions outside the subset: {dict(outside)}"


@pytest.mark.parametrize("arch", ARCHS)
def test_every_kernel_re_encodes_where_in_subset(arch):
    require_tool("nvdisasm")
    entries = Cubin(kernel_image(arch)).entries()
    total, decoded, outside, failures = _survey(arch, entries)
    print(f"{arch} all {len(entries)} kernels: {decoded}/{total} instructions in the subset "
          f"({100 * decoded / total:.1f}%)")
    print("outside the subset (mnemonic: count): " +
          ", ".join(f"{name}: {count}" for name, count in outside.most_common()))
    assert not failures, "\n".join(failures[:20])
