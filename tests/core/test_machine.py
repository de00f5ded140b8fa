"""The machine record's CPU class: from explicit flag sets (as /proc/cpuinfo spells them on real CPUs),
from a cpuinfo file, and on this machine."""

from __future__ import annotations

from pathlib import Path

import pytest

from retention_core import machine as M

# The speed-deciding part of "flags" on CPUs the figures were or may be measured on.
SAPPHIRE_RAPIDS = {"avx2", "avx_vnni", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_tile"}
ZEN4_EPYC = {"avx2", "avx512f", "avx512_vnni", "avx512_bf16"}
CASCADE_LAKE = {"avx2", "avx512f", "avx512_vnni"}
SKYLAKE_SP = {"avx2", "avx512f", "avx512cd"}
ALDER_LAKE = {"avx2", "avx_vnni"}
ZEN2_EPYC = {"avx2", "fma", "sse4_2"}
SANDY_BRIDGE = {"avx", "sse4_2"}


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (SAPPHIRE_RAPIDS, M.CLASS_AMX),
        (ZEN4_EPYC, M.CLASS_AVX512_VNNI_BF16),
        (CASCADE_LAKE, M.CLASS_AVX512_VNNI),
        (SKYLAKE_SP, M.CLASS_AVX512),
        (ALDER_LAKE, M.CLASS_AVX2_VNNI),
        (ZEN2_EPYC, M.CLASS_AVX2),
        (SANDY_BRIDGE, M.CLASS_BELOW_AVX2),
        (set(), M.CLASS_UNKNOWN),
    ],
)
def test_a_flag_set_gets_the_class_of_its_fastest_instruction_set(flags: set[str], expected: str) -> None:
    assert M.cpu_class(flags) == expected


def test_the_record_keeps_only_the_speed_flags_sorted_and_bf16_is_native_with_avx512_bf16_or_amx() -> None:
    assert M.speed_flags(SAPPHIRE_RAPIDS) == [
        "amx_tile",
        "avx2",
        "avx512_bf16",
        "avx512_vnni",
        "avx512f",
        "avx_vnni",
    ]
    assert M.speed_flags(ZEN2_EPYC) == ["avx2"] and M.speed_flags(SANDY_BRIDGE) == []
    assert M.native_bf16(ZEN4_EPYC) and M.native_bf16({"amx_tile"})
    assert not M.native_bf16(CASCADE_LAKE) and not M.native_bf16(ZEN2_EPYC) and not M.native_bf16(set())


def test_flags_are_read_from_the_flags_line_not_its_vmx_namesake(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\nmodel name\t: Some Xeon\nvmx flags\t: vnmi ept\n"
        "flags\t\t: fpu sse4_2 avx2 avx512f\n\n"
        "processor\t: 1\nmodel name\t: Some Xeon\nflags\t\t: fpu sse4_2 avx2 avx512f\n",
        encoding="utf-8",
    )
    assert M.cpu_flags(cpuinfo) == {"fpu", "sse4_2", "avx2", "avx512f"}
    assert M.cpuinfo_field("model name", cpuinfo) == "Some Xeon"
    assert M.cpu_flags(tmp_path / "absent") == frozenset()  # not Linux: the class is unknown, not a guess


def test_describe_records_this_machines_flags_and_class() -> None:
    record = M.describe()
    assert record["cpu_flags"] == M.speed_flags(M.cpu_flags())
    assert record["cpu_class"] == M.cpu_class(M.cpu_flags())
    assert record["cpu_class"] in {name for name, _ in M.CPU_CLASSES} | {M.CLASS_BELOW_AVX2, M.CLASS_UNKNOWN}
    assert M.recorded_cpu_class(record) == record["cpu_class"]
    assert M.recorded_cpu_class({"cpu": "AMD EPYC", "cores": 2}) == M.CLASS_UNRECORDED  # an older record
