"""The exporter's default ρ: the lowest measured ρ within one point (0.01 of a 0–1 value) of ρ = 1,
dense where that cannot be judged (``retention_core.contract.choose_default_rho``)."""

from __future__ import annotations

import pytest

from retention_core.contract import Manifest, QualityCurve, QualityPoint, choose_default_rho
from tests.training.test_retention_math import _manifest


def curve(values: dict[float, float], metric: str = "accuracy") -> QualityCurve:
    return QualityCurve(
        metric=metric,
        split="sst2/validation",
        num_examples=872,
        runtime="onnxruntime fp32",
        points=[QualityPoint(rho=rho, value=value) for rho, value in values.items()],
    )


def test_one_point_is_a_hundredth_of_a_curve_value() -> None:
    # Curve values are fractions in 0–1: a ρ 0.0099 below ρ = 1 is within one point, 0.0101 below is not,
    # and a loss of 0.5 (fifty points, but under "1" if values were read as percentages) never is.
    assert choose_default_rho(curve({0.3: 0.9001, 1.0: 0.91}))[0] == 0.3
    assert choose_default_rho(curve({0.3: 0.8999, 1.0: 0.91}))[0] == 1.0
    assert choose_default_rho(curve({0.3: 0.41, 1.0: 0.91}))[0] == 1.0


def test_monotone_curve_gets_the_lowest_rho_within_one_point() -> None:
    rho, rule = choose_default_rho(curve({0.1: 0.80, 0.3: 0.88, 0.5: 0.895, 0.7: 0.90, 1.0: 0.905}))
    assert rho == 0.5  # ρ = 0.3 loses 2.5 points: no; ρ = 0.5 loses 1.0 point: yes
    assert rule == "lowest measured rho within 1 point of rho=1 (accuracy on sst2/validation, 872 examples)"
    assert choose_default_rho(curve({0.3: 0.86, 0.5: 0.865, 1.0: 0.87}))[0] == 0.3  # exactly 1 point


def test_non_monotone_curve_judges_each_rho_on_its_own_point() -> None:
    # ρ = 0.5 dips below the tolerance, ρ = 0.3 is back within it: the lowest qualifying ρ is 0.3.
    assert choose_default_rho(curve({0.2: 0.70, 0.3: 0.905, 0.5: 0.85, 1.0: 0.91}))[0] == 0.3
    # Better than dense counts as no loss; points are not assumed sorted.
    assert choose_default_rho(curve({1.0: 0.90, 0.4: 0.93, 0.2: 0.80}))[0] == 0.4


def test_no_point_below_one_qualifies_so_dense() -> None:
    rho, rule = choose_default_rho(curve({0.1: 0.50, 0.5: 0.85, 0.7: 0.889, 1.0: 0.90}))
    assert rho == 1.0 and rule.startswith("lowest measured rho within 1 point of rho=1")


@pytest.mark.parametrize(
    "quality,rule",
    [
        (None, "no quality curve: dense (rho=1)"),
        (curve({}), "no rho=1 point in the quality curve (sst2/validation): dense (rho=1)"),
        (
            curve({0.3: 0.9, 0.7: 0.91}),
            "no rho=1 point in the quality curve (sst2/validation): dense (rho=1)",
        ),
    ],
)
def test_without_a_curve_or_its_rho_1_point_the_default_is_dense(
    quality: QualityCurve | None, rule: str
) -> None:
    assert choose_default_rho(quality) == (1.0, rule)


def test_manifests_without_the_rule_still_load() -> None:
    older = _manifest(2, None).model_dump(mode="json")
    del older["default_rho_rule"]  # written before the field existed
    assert Manifest.model_validate(older).default_rho_rule is None
