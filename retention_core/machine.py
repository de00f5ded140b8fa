"""The machine a number was measured on: CPU model, the instruction sets that decide its speed (and the
class they make), cores, library versions and the git commit.

Torch-free (versions come from package metadata), so training results, the benchmarks, the load
client and the serving install all record it the same way.
"""

from __future__ import annotations

import os
import platform
import subprocess
from collections.abc import Iterable, Mapping
from importlib import metadata
from pathlib import Path

LIBRARIES = ("onnxruntime", "torch", "transformers", "tokenizers")
CPUINFO = Path("/proc/cpuinfo")

# The x86 instruction sets (as /proc/cpuinfo's "flags" spells them) that decide how fast our numbers
# are: int8 GEMMs run one instruction per 4 products with VNNI (512- or 256-bit) and in tiles with AMX,
# bf16 is native with avx512_bf16 or AMX (emulated, ~23x slower a training step, without), and fp32's
# vector width is AVX-512 or AVX2. The same model on two classes can rank its precisions differently.
AVX2 = "avx2"
AVX512F = "avx512f"
AVX512_VNNI = "avx512_vnni"
AVX512_BF16 = "avx512_bf16"
AMX_TILE = "amx_tile"
AVX_VNNI = "avx_vnni"
SPEED_FLAGS = frozenset({AVX2, AVX512F, AVX512_VNNI, AVX512_BF16, AMX_TILE, AVX_VNNI})
NATIVE_BF16_FLAGS = frozenset({AVX512_BF16, AMX_TILE})

# A CPU's class: the first whose flags it has, fastest first (a figure holds on machines of its class).
CLASS_AMX = "amx"
CLASS_AVX512_VNNI_BF16 = "avx512-vnni-bf16"
CLASS_AVX512_VNNI = "avx512-vnni"
CLASS_AVX512 = "avx512"
CLASS_AVX2_VNNI = "avx2-vnni"
CLASS_AVX2 = "avx2"
CLASS_BELOW_AVX2 = "pre-avx2"  # flags read, none of the classes': an old x86
CLASS_UNKNOWN = "unknown"  # no flags read: not Linux, or not x86 (an Arm /proc/cpuinfo has "Features")
CLASS_UNRECORDED = "unrecorded"  # a machine record written before the class was (no "cpu_class")
CPU_CLASSES: tuple[tuple[str, frozenset[str]], ...] = (
    (CLASS_AMX, frozenset({AMX_TILE})),
    (CLASS_AVX512_VNNI_BF16, frozenset({AVX512F, AVX512_VNNI, AVX512_BF16})),
    (CLASS_AVX512_VNNI, frozenset({AVX512F, AVX512_VNNI})),
    (CLASS_AVX512, frozenset({AVX512F})),
    (CLASS_AVX2_VNNI, frozenset({AVX2, AVX_VNNI})),
    (CLASS_AVX2, frozenset({AVX2})),
)


def cpuinfo_field(name: str, cpuinfo: Path = CPUINFO) -> str | None:
    """The first processor's ``name`` field in /proc/cpuinfo (every core reports the same), or None."""
    try:
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == name:
                return value.strip()
    except OSError:
        pass
    return None


def cpu_model() -> str:
    return cpuinfo_field("model name") or platform.processor()


def cpu_flags(cpuinfo: Path = CPUINFO) -> frozenset[str]:
    """Every instruction-set flag the kernel reports for this CPU; empty where it reports none."""
    return frozenset((cpuinfo_field("flags", cpuinfo) or "").split())


def speed_flags(flags: Iterable[str]) -> list[str]:
    """The speed-deciding ones of ``flags``, sorted (what a machine record holds)."""
    return sorted(SPEED_FLAGS.intersection(flags))


def cpu_class(flags: Iterable[str]) -> str:
    """The class of a CPU with ``flags``: CPU_CLASSES' first match, else CLASS_BELOW_AVX2, or
    CLASS_UNKNOWN when there are no flags at all."""
    present = frozenset(flags)
    if not present:
        return CLASS_UNKNOWN
    return next((name for name, needed in CPU_CLASSES if needed <= present), CLASS_BELOW_AVX2)


def native_bf16(flags: Iterable[str]) -> bool:
    """Whether the CPU computes bf16 dot products in hardware (else torch emulates them through fp32)."""
    return not NATIVE_BF16_FLAGS.isdisjoint(flags)


def recorded_cpu_class(machine: Mapping[str, object]) -> str:
    """The class a machine record (``describe()``, possibly an older one) names."""
    return str(machine.get("cpu_class") or CLASS_UNRECORDED)


def library_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def git_commit() -> str:
    """The checkout's short commit; ``GIT_COMMIT`` where the tree travelled without its .git."""
    try:
        result = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    except OSError:  # no git on this machine
        return os.environ.get("GIT_COMMIT", "")
    return result.stdout.strip() or os.environ.get("GIT_COMMIT", "")


def describe() -> dict[str, object]:
    versions = {name: version for name in LIBRARIES if (version := library_version(name))}
    flags = cpu_flags()
    return {
        "cpu": cpu_model(),
        "cpu_class": cpu_class(flags),
        "cpu_flags": speed_flags(flags),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        **versions,
        "commit": git_commit(),
    }
