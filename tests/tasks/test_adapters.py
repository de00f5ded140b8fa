"""Training batches and losses of the QA and summarization adapters; BBC split."""

from __future__ import annotations

from typing import Any

import torch

from tests.tasks.rows import BBC_ROWS, SCITLDR_ROWS, SQUAD_ROWS, squad_row
from training.tasks.registry import training_task


def test_qa_targets_point_at_the_answer(hf_tokenizer: Any) -> None:
    adapter = training_task("qa")
    batch = adapter.make_batch(SQUAD_ROWS, hf_tokenizer, 384)
    assert batch.input_ids.shape[0] == len(SQUAD_ROWS)  # every context fits one window
    assert batch.protected is not None and batch.token_type_ids is not None
    for i, row in enumerate(SQUAD_ROWS):
        start, end = batch.targets[i].tolist()
        span = hf_tokenizer.decode(batch.input_ids[i, start : end + 1])
        assert span.replace(" ", "") == row["answers"]["text"][0].lower().replace(" ", "")
        assert not batch.protected[i, start : end + 1].any()
    logits = torch.zeros(*batch.input_ids.shape, 2, requires_grad=True)
    loss = adapter.loss(logits, batch)
    loss.backward()
    assert torch.isfinite(loss) and logits.grad is not None


def test_qa_windows_without_the_answer_point_at_cls(hf_tokenizer: Any) -> None:
    adapter = training_task("qa")
    row = squad_row("x", "Who was the leader?", SQUAD_ROWS[0]["context"], "Rollo")
    batch = adapter.make_batch([row], hf_tokenizer, 32)
    assert batch.input_ids.shape[0] > 2
    targets = batch.targets.tolist()
    with_answer = [t for t in targets if t != [0, 0]]
    assert 1 <= len(with_answer) < len(targets)
    for i, (start, end) in enumerate(targets):
        if (start, end) != (0, 0):
            assert hf_tokenizer.decode(batch.input_ids[i, start : end + 1]) == "rollo"
    # Padded positions never win: a huge logit on a pad does not change the loss.
    logits = torch.zeros(*batch.input_ids.shape, 2)
    base = adapter.loss(logits, batch)
    pads = ~batch.attention_mask.bool()
    if pads.any():
        logits[pads] = 1e3
        assert torch.allclose(adapter.loss(logits, batch), base)


def test_summarization_batch_and_pooled_loss(hf_tokenizer: Any) -> None:
    adapter = training_task("summarization")
    rows = SCITLDR_ROWS[:3] + BBC_ROWS[:1]
    batch = adapter.make_batch(rows, hf_tokenizer, 256)
    assert batch.extra is not None
    segments = batch.extra["segments"]
    assert batch.input_ids.shape[0] == len(rows)
    for i, row in enumerate(rows[:3]):
        sentences = row["document"]
        assert int(segments[i].max()) + 1 == len(sentences)
        assert batch.targets[i, : len(sentences)].tolist() == [float(x) for x in row["extractive_labels"]]
    # BBC: sentences in the summary (joined without spaces) are labelled 1.
    assert batch.targets[3, :4].tolist() == [1.0, 0.0, 1.0, 0.0]
    assert (segments[~batch.attention_mask.bool()] == -1).all()
    assert (segments[:, 0] == -1).all()  # [CLS]
    # A logit that is high on exactly the positive sentences' tokens gives a lower loss.
    positive = torch.zeros_like(segments, dtype=torch.float32)
    for i in range(len(rows)):
        for slot, label in enumerate(batch.targets[i].tolist()):
            positive[i][segments[i] == slot] = 4.0 if label == 1.0 else -4.0
    good = adapter.loss(positive.unsqueeze(-1), batch)
    bad = adapter.loss((-positive).unsqueeze(-1), batch)
    assert good < 0.1 < bad


def test_summarization_long_documents_use_windows(hf_tokenizer: Any) -> None:
    adapter = training_task("summarization")
    batch = adapter.make_batch(SCITLDR_ROWS[2:3], hf_tokenizer, 16)
    assert batch.input_ids.shape[0] > 1
    assert batch.extra is not None
    valid = batch.targets != -1.0
    assert valid.any(1).all()  # every window has at least one sentence


def test_bbc_split_is_deduplicated_and_deterministic() -> None:
    from retention_tasks.summarization.training import bbc_keep, bbc_split_of

    first: dict[str, object] = {**BBC_ROWS[0], "document": "Unique test text."}
    duplicate: dict[str, object] = {**BBC_ROWS[1], "document": "Unique  test text."}
    for _ in range(2):  # same answer on every pass over the data
        assert [bbc_keep(first, bbc_split_of(str(first["id"])))] == [True]
        assert not any(bbc_keep(duplicate, split) for split in ("train", "validation", "test"))
    assert sum(bbc_keep(first, split) for split in ("train", "validation", "test")) == 1


def test_reference_sentences_split_where_glued() -> None:
    from retention_tasks.summarization.learn import references, summary_sentences

    glued = "Sales rose to $10.9bn.For the year, the U.S. firm gained.J. Smith agreed!“Yes,” he said."
    assert summary_sentences(glued) == [
        "Sales rose to $10.9bn.",
        "For the year, the U.S. firm gained.",
        "J. Smith agreed!",
        "“Yes,” he said.",
    ]
    assert references(BBC_ROWS[0]) == [
        "Profits rose 76% to $1.13bn (£600m) at Time Warner.\n"
        "TimeWarner said fourth quarter sales rose 2% to $11.1bn."
    ]
    assert len(references(SCITLDR_ROWS[0])) == 2
