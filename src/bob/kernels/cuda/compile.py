"""Compile Bob's CUDA C kernels with NVRTC into a cubin, cached on disk.

    python -m bob.kernels.cuda.compile sm_90      # compile (or hit the cache), print a summary

The options pin Bob's binary32 arithmetic (docs/ARITHMETIC.md): no fused
multiply-add, IEEE division and square root, subnormals kept. The output is a
cubin (SASS for one architecture), never PTX: the machine code the plan
retains is the code that runs. NVRTC needs no GPU, so CI compiles for every target.

Compiled images are cached under ``$BOB_CACHE_DIR/cubin`` (or
``~/.cache/bob/cubin``), keyed by the SHA-256 of everything that decides the
bytes: the source and its headers, the options, the architecture and the NVRTC
version. Entries are written with ``bob.files.atomic_write``; an
entry that is not an ELF image is ignored and rewritten.
"""

from __future__ import annotations

import hashlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from bob.config import TARGET_NAMES
from bob.errors import BobError, RunFailure
from bob.files import atomic_write

SOURCE_NAME = "bob_kernels.cu"
KERNEL_DIR = Path(__file__).resolve().parent
ELF_MAGIC = b"\x7fELF"
CACHE_FORMAT = b"bob-cubin-cache 1"

# Binary32 exactly as written. Order is part of the cache key.
ARITHMETIC_OPTIONS = ("--fmad=false", "-prec-div=true", "-prec-sqrt=true", "-ftz=false")

# What NVRTC's status names mean for someone compiling Bob's kernels.
_EXPLANATIONS = {
    "NVRTC_ERROR_COMPILATION": "the CUDA C source did not compile; the log says where",
    "NVRTC_ERROR_INVALID_OPTION": "NVRTC refused an option (an architecture it does not know?)",
    "NVRTC_ERROR_INVALID_INPUT": "an argument to NVRTC was invalid",
    "NVRTC_ERROR_OUT_OF_MEMORY": "NVRTC ran out of host memory",
    "NVRTC_ERROR_PROGRAM_CREATION_FAILURE": "NVRTC could not create the program",
    "NVRTC_ERROR_BUILTIN_OPERATION_FAILURE": "NVRTC failed internally (a broken install?)",
}


class NvrtcError(RunFailure):
    """An NVRTC call failed: the call, NVRTC's status name, what it means, the log."""

    def __init__(self, call: str, status: str, explanation: str, log: str = ""):
        self.call = call
        self.status = status
        self.explanation = explanation
        self.log = log
        message = f"{call} failed: {status} ({explanation})"
        if log.strip():
            message += "\n" + log.rstrip()
        super().__init__(message)


@dataclass(frozen=True)
class KernelSource:
    """A CUDA C translation unit with the headers it may include, all in memory.

    NVRTC sees exactly these bytes (no include path), so the cache key covers
    everything that decides the image.
    """

    name: str  # the program name NVRTC prints in its log
    text: str
    headers: tuple[tuple[str, str], ...] = ()  # (include name, text)


@dataclass(frozen=True)
class CompiledImage:
    arch: str  # "sm_90"
    image: bytes  # the cubin (an ELF file)
    key: str  # the SHA-256 cache key, hex
    options: tuple[str, ...]
    nvrtc_version: tuple[int, int]
    path: Path | None  # the cache entry, where one could be written
    cached: bool  # True when the image came from the cache
    log: str = ""  # NVRTC's log (warnings), empty when cached


def _nvrtc():
    """The NVRTC bindings module, or a typed error saying how to get it."""
    try:
        from cuda.bindings import nvrtc
    except ImportError as error:
        raise NvrtcError(
            "import cuda.bindings.nvrtc", "ImportError",
            f"{error}; install the CUDA extras: pip install 'bob-bigram[cuda]'",
        ) from error
    return nvrtc


def _status_name(nvrtc, status) -> str:
    try:
        result, name = nvrtc.nvrtcGetErrorString(status)
    except Exception:  # a status we cannot name is still reported, by number
        return f"nvrtcResult {int(status)}"
    if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        return f"nvrtcResult {int(status)}"
    return name.decode(errors="replace")


def check(call: str, result: tuple, log: str = ""):
    """Every NVRTC result passes here: the values on success, NvrtcError otherwise."""
    nvrtc = _nvrtc()
    status, *values = result
    if status != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        name = _status_name(nvrtc, status)
        explanation = _EXPLANATIONS.get(name, "see the NVRTC documentation for this status")
        raise NvrtcError(call, name, explanation, log)
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def nvrtc_version() -> tuple[int, int]:
    nvrtc = _nvrtc()
    try:
        major, minor = check("nvrtcVersion", nvrtc.nvrtcVersion())
    except NvrtcError:
        raise
    except Exception as error:  # the NVRTC shared library itself did not load
        raise NvrtcError(
            "nvrtcVersion", type(error).__name__,
            f"{error}; install the NVRTC wheel: pip install nvidia-cuda-nvrtc",
        ) from error
    return int(major), int(minor)


def normalize_arch(arch: str | int | tuple[int, int]) -> str:
    """'sm_90', '90', 90 or (9, 0) -> 'sm_90'."""
    if isinstance(arch, tuple):
        major, minor = arch
        return f"sm_{major}{minor}"
    text = str(arch).strip().lower()
    if text.startswith("sm_"):
        text = text[3:]
    if not text.isdigit() or len(text) < 2:
        raise ValueError(f"architecture must look like 'sm_90', not {arch!r}")
    return f"sm_{text}"


def options_for(arch: str) -> tuple[str, ...]:
    return (*ARITHMETIC_OPTIONS, f"-arch={normalize_arch(arch)}")


def cache_directory() -> Path:
    root = os.environ.get("BOB_CACHE_DIR")
    base = Path(root) if root else Path.home() / ".cache" / "bob"
    return base / "cubin"


def cache_key(source: KernelSource, options: tuple[str, ...], arch: str,
              version: tuple[int, int]) -> str:
    """SHA-256 over length-prefixed fields, so no two inputs share a key by concatenation."""
    digest = hashlib.sha256()

    def field(data: bytes) -> None:
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)

    field(CACHE_FORMAT)
    field(source.name.encode())
    field(source.text.encode())
    for include, text in source.headers:
        field(include.encode())
        field(text.encode())
    for option in options:
        field(option.encode())
    field(arch.encode())
    field(f"{version[0]}.{version[1]}".encode())
    return digest.hexdigest()


def shipped_source() -> KernelSource:
    """``bob_kernels.cu`` and every ``*.cuh`` beside it, as the package installs them."""
    path = KERNEL_DIR / SOURCE_NAME
    if not path.is_file():
        raise RunFailure(
            f"{path} is missing: the CUDA kernels are not in this installation "
            "(reinstall bob, or use the cpu backend)"
        )
    headers = tuple(
        (header.name, header.read_text()) for header in sorted(KERNEL_DIR.glob("*.cuh"))
    )
    return KernelSource(SOURCE_NAME, path.read_text(), headers)


def _read_cache(path: Path) -> bytes | None:
    try:
        image = path.read_bytes()
    except OSError:
        return None
    return image if image.startswith(ELF_MAGIC) else None


def _write_cache(path: Path, image: bytes) -> bool:
    """Write atomically; False (and no entry) where the cache cannot be written."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, image)
    except (OSError, BobError):
        return False
    return True


def _compile(source: KernelSource, options: tuple[str, ...]) -> tuple[bytes, str]:
    nvrtc = _nvrtc()
    program = check("nvrtcCreateProgram", nvrtc.nvrtcCreateProgram(
        source.text.encode(), source.name.encode(), len(source.headers),
        [text.encode() for _, text in source.headers],
        [name.encode() for name, _ in source.headers],
    ))
    try:
        encoded = [option.encode() for option in options]
        status, = nvrtc.nvrtcCompileProgram(program, len(encoded), encoded)
        log = _program_log(nvrtc, program)
        check("nvrtcCompileProgram", (status,), log)
        size = check("nvrtcGetCUBINSize", nvrtc.nvrtcGetCUBINSize(program))
        image = bytearray(size)
        check("nvrtcGetCUBIN", nvrtc.nvrtcGetCUBIN(program, image))
    finally:
        nvrtc.nvrtcDestroyProgram(program)
    if not image.startswith(ELF_MAGIC):
        raise NvrtcError("nvrtcGetCUBIN", "not an ELF image",
                         "NVRTC returned something other than a cubin")
    return bytes(image), log


def _program_log(nvrtc, program) -> str:
    size = check("nvrtcGetProgramLogSize", nvrtc.nvrtcGetProgramLogSize(program))
    if size <= 1:
        return ""
    log = bytearray(size)
    check("nvrtcGetProgramLog", nvrtc.nvrtcGetProgramLog(program, log))
    return bytes(log).rstrip(b"\0").decode(errors="replace")


def compile_source(source: KernelSource, arch: str | int | tuple[int, int], *,
                   use_cache: bool = True, cache_dir: Path | None = None) -> CompiledImage:
    """Compile one translation unit for one architecture, through the cache."""
    arch = normalize_arch(arch)
    version = nvrtc_version()
    options = options_for(arch)
    key = cache_key(source, options, arch, version)
    path = (cache_dir or cache_directory()) / f"{arch}-{key}.cubin"
    if use_cache:
        image = _read_cache(path)
        if image is not None:
            return CompiledImage(arch, image, key, options, version, path, cached=True)
    image, log = _compile(source, options)
    written = use_cache and _write_cache(path, image)
    return CompiledImage(arch, image, key, options, version, path if written else None,
                         cached=False, log=log)


def compile_kernels(arch: str | int | tuple[int, int], *, use_cache: bool = True,
                    cache_dir: Path | None = None) -> CompiledImage:
    """Bob's shipped kernels for `arch`."""
    return compile_source(shipped_source(), arch, use_cache=use_cache, cache_dir=cache_dir)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    archs = args or list(TARGET_NAMES)
    for arch in archs:
        compiled = compile_kernels(arch)
        origin = "cache" if compiled.cached else "NVRTC"
        nvrtc = ".".join(map(str, compiled.nvrtc_version))
        print(f"{compiled.arch}: {len(compiled.image)} bytes from {origin} {nvrtc}, "
              f"key {compiled.key[:16]}, {compiled.path or 'not cached'}")
        if compiled.log:
            print(compiled.log)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
