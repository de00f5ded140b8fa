"""A graph's feeds are exactly its task's inputs (``TaskSpec.feeds``), not what the rows happen to carry."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from retention_core.codecs.base import Row
from retention_core.contract import BASE_INPUTS
from retention_core.tasks import TASKS, task_spec

QA_ROW = Row((101, 7, 102, 8, 9, 102), token_type_ids=(0, 0, 0, 1, 1, 1), protected=(1, 1, 1, 0, 0, 0))
PLAIN_ROW = Row((101, 5, 102))


@pytest.mark.parametrize("task", sorted(TASKS))
def test_feeds_are_the_task_inputs_in_order(task: str) -> None:
    spec = task_spec(task)
    rows = [spec.example_row((101, 5, 6, 102)), spec.example_row((101, 102))]
    feeds = spec.feeds(rows, [0.5, 1.0], pad_id=0, length=8)
    assert list(feeds) == [*spec.token_inputs, "rho"]
    assert {name for name in feeds} == {tensor.name for tensor in spec.inputs}
    assert feeds["input_ids"].shape == (2, 8) and feeds["attention_mask"][1].tolist() == [1, 1] + [0] * 6
    np.testing.assert_array_equal(feeds["rho"], np.asarray([0.5, 1.0], dtype=np.float32))


def test_qa_feeds_read_segments_and_protection_off_the_rows() -> None:
    feeds = task_spec("qa").feeds([QA_ROW, PLAIN_ROW], [1.0, 1.0], pad_id=0)
    assert feeds["token_type_ids"][0].tolist() == [0, 0, 0, 1, 1, 1]
    assert feeds["protected_mask"][0].tolist() == [1, 1, 1, 0, 0, 0]
    assert feeds["protected_mask"][1].tolist() == [0] * 6  # a row without the field: zeros


def test_a_row_field_the_task_does_not_take_is_not_fed() -> None:
    """Segment ids on the rows of a task whose graph takes none (the old rule fed them, and a protected
    mask with them, whenever a row carried them)."""
    feeds = task_spec("classification").feeds([QA_ROW], [1.0], pad_id=0)
    assert list(feeds) == ["input_ids", "attention_mask", "rho"]


def test_an_input_no_row_field_feeds_is_refused_at_registration() -> None:
    spec = task_spec("classification")
    mystery = BASE_INPUTS[0].model_copy(update={"name": "mystery_ids"})
    with pytest.raises(ValueError, match="mystery_ids"):
        replace(spec, name="mystery", inputs=(*spec.inputs, mystery))
