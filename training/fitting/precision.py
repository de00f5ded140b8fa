"""Whether a training precision runs at a usable speed where it would run. bf16 autocast is fast on GPUs
and on CPUs that compute bf16 in hardware (avx512_bf16, AMX: ~1.75x fp32's speed a step); elsewhere torch
emulates it through fp32, and a MiniLM step measured 81 s against 3.5 s in fp32 (2-core AVX2 EPYC, issue
64). A command that would train for days instead of hours stops first and says why.

Torch-free: the decision is a pure function of the CPU's flags (``retention_core.machine``), the device and
the precision, so it is tested on the flag sets of real CPUs, not only on the machine running the tests.
"""

from __future__ import annotations

from collections.abc import Iterable

from retention_core.machine import CLASS_UNKNOWN, cpu_class, native_bf16

FP32 = "fp32"
BF16 = "bf16"
TRAINING_PRECISIONS = (FP32, BF16)  # the keys of training.fitting.fit.PRECISIONS
CPU_DEVICE = "cpu"
ALLOW_SLOW_BF16 = "--allow-slow-bf16"  # the command-line option that runs it anyway
# The measurement the refusal quotes (a MiniLM training step, fp32 vs bf16 autocast, AVX2-only CPU).
EMULATED_BF16_STEP_S = 81.0
FP32_STEP_S = 3.5
EMULATED_BF16_SLOWDOWN = EMULATED_BF16_STEP_S / FP32_STEP_S


def device_type(device: str) -> str:
    """``cuda`` of ``cuda:1``: torch's device type, without importing torch."""
    return device.split(":", 1)[0]


def emulated_bf16_refusal(precision: str, device: str, flags: Iterable[str]) -> str | None:
    """Why training at ``precision`` on ``device`` of a CPU with ``flags`` should not start, or None when
    it may: bf16 on a CPU device whose flags lack native bf16. No flags read (not Linux x86: an Arm CPU
    may have bf16 under another name) is not refused: the slowdown was measured on x86 only."""
    present = frozenset(flags)
    if precision != BF16 or device_type(device) != CPU_DEVICE:
        return None
    if native_bf16(present) or cpu_class(present) == CLASS_UNKNOWN:
        return None
    return (
        f"--precision bf16 on this CPU (class {cpu_class(present)}: no avx512_bf16, no amx_tile) is emulated "
        f"through fp32: a training step measured {EMULATED_BF16_SLOWDOWN:.0f}x slower than fp32 "
        f"({EMULATED_BF16_STEP_S:g} s against {FP32_STEP_S:g} s, MiniLM on a 2-core AVX2 EPYC). Train with "
        f"--precision fp32 (the same run up to bf16 rounding), on a GPU (--device cuda), or pass "
        f"{ALLOW_SLOW_BF16} to run it anyway."
    )
