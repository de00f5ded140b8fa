"""bf16 training where the CPU emulates it stops with the measured slowdown (training.fitting.precision): the
decision from the flag sets of real CPUs, and the command line that applies it, on any machine."""

from __future__ import annotations

import pytest

from training.__main__ import parser, refuse_emulated_bf16
from training.fitting.precision import ALLOW_SLOW_BF16, BF16, FP32, TRAINING_PRECISIONS, emulated_bf16_refusal

AVX2_ONLY = {"avx2", "fma", "sse4_2"}  # the EPYC bf16 was measured ~23x slower on
CASCADE_LAKE = {"avx2", "avx512f", "avx512_vnni"}  # AVX-512, but bf16 still emulated
ZEN4 = {"avx2", "avx512f", "avx512_vnni", "avx512_bf16"}
SAPPHIRE_RAPIDS = {"avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile"}
NO_FLAGS: set[str] = set()  # not Linux x86: nothing measured, nothing refused


@pytest.mark.parametrize("flags", [AVX2_ONLY, CASCADE_LAKE])
def test_bf16_on_a_cpu_without_native_bf16_is_refused_naming_the_slowdown_and_the_way_out(
    flags: set[str],
) -> None:
    for device in ("cpu", "cpu:0"):
        message = emulated_bf16_refusal(BF16, device, flags)
        assert message is not None
        assert "23x slower" in message and "81 s against 3.5 s" in message and ALLOW_SLOW_BF16 in message


@pytest.mark.parametrize(
    ("precision", "device", "flags"),
    [
        (BF16, "cpu", ZEN4),
        (BF16, "cpu", SAPPHIRE_RAPIDS),
        (BF16, "cpu", NO_FLAGS),
        (BF16, "cuda", AVX2_ONLY),  # the GPU computes it, whatever the host CPU
        (BF16, "cuda:1", AVX2_ONLY),
        (FP32, "cpu", AVX2_ONLY),
    ],
)
def test_native_bf16_a_gpu_or_fp32_trains(precision: str, device: str, flags: set[str]) -> None:
    assert emulated_bf16_refusal(precision, device, flags) is None


@pytest.mark.parametrize(
    "argv",
    [
        ["fit", "recipe.yaml", "--precision", "bf16"],
        ["retrofit", "model", "--texts", "t.txt", "--precision", "bf16"],
        ["build", "recipe.yaml", "--precision", "bf16"],
    ],
)
def test_every_training_command_stops_before_emulated_bf16_unless_allowed(argv: list[str]) -> None:
    with pytest.raises(SystemExit, match=f"^{argv[0]}: --precision bf16 on this CPU"):
        refuse_emulated_bf16(parser().parse_args(argv), AVX2_ONLY)
    allowed = parser().parse_args([*argv, ALLOW_SLOW_BF16])
    assert allowed.allow_slow_bf16 and allowed.precision == BF16
    refuse_emulated_bf16(allowed, AVX2_ONLY)  # returns: the user chose the slow run
    refuse_emulated_bf16(parser().parse_args(argv), ZEN4)


def test_a_command_without_precision_and_a_gpu_fit_are_not_refused() -> None:
    on_gpu = parser().parse_args(["fit", "recipe.yaml", "--precision", "bf16", "--device", "cuda"])
    refuse_emulated_bf16(on_gpu, AVX2_ONLY)
    evaluate = parser().parse_args(["evaluate", "run"])
    assert "precision" not in evaluate
    refuse_emulated_bf16(evaluate, AVX2_ONLY)


def test_the_command_lines_precisions_are_the_ones_fit_trains_at() -> None:
    from training.fitting.fit import PRECISIONS

    assert set(TRAINING_PRECISIONS) == set(PRECISIONS)
