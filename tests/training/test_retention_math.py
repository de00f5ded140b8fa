"""The retention math: schedule, Hard-Concrete gates, Lagrangian, scorer, top-k selection."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from retention_core.contract import Backbone, Manifest, Schedule
from retention_core.usage import token_work
from training.engine import selection as S
from training.engine import terms as T


# ----------------------------------------------------------------------------- schedule
@pytest.mark.parametrize("power", [0.5, 1.0, 2.0])
def test_keep_fractions_end_at_rho_and_never_increase(power: float) -> None:
    rho = torch.tensor([0.1, 0.3, 0.5, 0.77, 1.0])
    fractions = S.keep_fractions(rho, num_points=6, power=power)  # (B, P)
    assert fractions.shape == (5, 6)
    torch.testing.assert_close(fractions[:, -1], rho)
    assert torch.all(fractions[:, 1:] <= fractions[:, :-1] + 1e-7)
    torch.testing.assert_close(fractions[-1], torch.ones(6))


def test_front_loaded_schedule_prunes_earlier() -> None:
    rho = torch.tensor([0.3])
    geometric = S.keep_fractions(rho, 6, power=1.0)
    front = S.keep_fractions(rho, 6, power=0.5)
    assert torch.all(front[:, :-1] < geometric[:, :-1])
    assert math.isclose(geometric[0, 0].item(), 0.3 ** (1 / 6), rel_tol=1e-6)


def test_keep_counts_round_and_respect_bounds() -> None:
    rho = torch.tensor([0.3, 0.3, 0.01, 1.0])
    num_real = torch.tensor([10, 100, 50, 7])
    protected = torch.tensor([1, 1, 5, 1])
    counts = S.keep_counts(rho, num_real, protected, num_points=4, power=1.0)  # (B, P)
    assert counts[0, -1].item() == 3 and counts[1, -1].item() == 30  # round(ρ·n)
    assert counts[2].min().item() == 5  # never below the protected tokens
    assert counts[3].tolist() == [7, 7, 7, 7]  # ρ = 1 keeps everything
    assert torch.all(counts <= num_real.unsqueeze(-1))
    assert torch.all(counts[:, 1:] <= counts[:, :-1])


def test_keep_counts_floor_runs_short_rows_dense_and_holds_long_rows_at_the_floor() -> None:
    """At ρ = 0.3 without a floor "great film" ([CLS] great film [SEP]) keeps 1 token of 4."""
    rho = torch.tensor([0.3, 0.3, 0.3, 0.2, 0.9])
    num_real = torch.tensor([4, 16, 40, 200, 40])
    protected = torch.ones(5, dtype=torch.long)
    bare = S.keep_counts(rho, num_real, protected, num_points=6, power=0.5)  # (B, P)
    assert bare[0, -1].item() == 1  # the defect: one token of four reaches the last layer
    floored = S.keep_counts(rho, num_real, protected, num_points=6, power=0.5, min_kept=16)  # (B, P)
    assert floored[0].tolist() == [4] * 6 and floored[1].tolist() == [16] * 6  # at or under: dense
    assert floored[2].min().item() == 16 and floored[2, -1].item() == 16  # round(0.3·40) = 12 → 16
    torch.testing.assert_close(floored[3], bare[3])  # 40 of 200 at ρ = 0.2: the floor never binds
    torch.testing.assert_close(floored[4], bare[4])  # 36 of 40 at ρ = 0.9: nor here
    assert torch.all(floored >= torch.minimum(num_real, torch.tensor(16)).unsqueeze(-1))
    assert torch.all(floored[:, 1:] <= floored[:, :-1])  # still non-increasing
    assert torch.all(floored <= num_real.unsqueeze(-1))


def test_keep_counts_floor_zero_is_the_schedule_without_a_floor() -> None:
    generator = torch.Generator().manual_seed(0)
    rho = torch.rand(64, generator=generator).clamp(min=0.05)  # (B,)
    num_real = torch.randint(1, 300, (64,), generator=generator)  # (B,)
    protected = torch.randint(1, 20, (64,), generator=generator).clamp(max=num_real)  # (B,)
    floor_zero = S.keep_counts(rho, num_real, protected, 6, 0.5, min_kept=0)
    assert torch.equal(floor_zero, S.keep_counts(rho, num_real, protected, 6, 0.5))
    floored = S.keep_counts(rho, num_real, protected, 6, 0.5, min_kept=16)
    assert torch.equal(floored, torch.maximum(floor_zero, S.floor_tokens(num_real, 16).unsqueeze(-1)))


def test_floored_fractions_are_the_counts_targets_and_bit_identical_at_floor_zero() -> None:
    rho = torch.tensor([0.3, 0.3, 0.5])
    num_real = torch.tensor([4, 40, 400])
    fractions = S.keep_fractions(rho, 6, 0.5)  # (B, P)
    assert T.floored_fractions(fractions, num_real, 0) is fractions  # the reference objective untouched
    floored = T.floored_fractions(fractions, num_real, 16)
    torch.testing.assert_close(floored[0], torch.ones(6))  # 4 tokens under a floor of 16: all kept
    torch.testing.assert_close(floored[1, -1], torch.tensor(0.4))  # 16 / 40 beats ρ = 0.3
    torch.testing.assert_close(floored[2], fractions[2])  # 200 of 400 ≫ 16
    assert torch.all(floored[:, 1:] <= floored[:, :-1])


def test_conditional_rates_multiply_back_to_fractions() -> None:
    fractions = S.keep_fractions(torch.tensor([0.2, 0.6]), 5, 1.0)
    rates = T.conditional_keep_rates(fractions)
    torch.testing.assert_close(torch.cumprod(rates, dim=1), fractions)


def test_candidate_fractions_count_protected_tokens_against_the_budget() -> None:
    fractions = torch.tensor([[0.8, 0.5, 0.2], [0.8, 0.5, 0.2], [1.0, 1.0, 1.0]])  # (B, P)
    num_real = torch.tensor([100, 100, 10])
    num_protected = torch.tensor([0, 20, 10])  # the last row has nothing to drop
    shares = T.candidate_keep_fractions(fractions, num_real, num_protected)
    torch.testing.assert_close(shares[0], fractions[0])
    torch.testing.assert_close(shares[1], torch.tensor([0.75, 0.375, 0.0]))  # (80−20)/80, (50−20)/80, 0
    torch.testing.assert_close(shares[2], torch.ones(3))
    rates = T.conditional_keep_rates(shares)
    assert torch.isfinite(rates).all() and rates[1, 2] == 0.0


# ----------------------------------------------------------------------------- gates
def test_hard_concrete_statistics_match_expected_l0() -> None:
    gate = T.HardConcrete()
    generator = torch.Generator().manual_seed(0)
    for log_alpha_value in (-2.0, 0.0, 1.5):
        log_alpha = torch.full((200_000,), log_alpha_value)
        samples = gate.sample(log_alpha, generator)
        assert samples.min() >= 0.0 and samples.max() <= 1.0
        empirical = (samples > 0).float().mean().item()
        expected = gate.prob_nonzero(torch.tensor(log_alpha_value)).item()
        assert abs(empirical - expected) < 0.005
    # stretched + clamped: exact zeros and ones both happen
    samples = gate.sample(torch.zeros(10_000), generator)
    assert (samples == 0).any() and (samples == 1).any()


def test_hard_concrete_deterministic_gate_and_prior() -> None:
    gate = T.HardConcrete()
    assert gate.deterministic(torch.tensor(10.0)).item() == 1.0
    assert gate.deterministic(torch.tensor(-10.0)).item() == 0.0
    rate = torch.tensor([0.1, 0.5, 0.9])
    torch.testing.assert_close(gate.prob_nonzero(gate.log_alpha_for_rate(rate)), rate)


# ----------------------------------------------------------------------------- Lagrangian
def test_lambda_rises_when_over_budget_and_stays_non_negative() -> None:
    lam = torch.zeros(3)
    over = torch.tensor([0.2, 0.0, -0.3])
    for _ in range(5):
        lam = T.dual_ascent(lam, over, lr=1e-2)
    assert lam[0].item() == pytest.approx(0.01)
    assert lam[1].item() == 0.0 and lam[2].item() == 0.0  # projected at 0
    lam = T.dual_ascent(torch.tensor([0.5]), torch.tensor([-1.0]), lr=0.1)
    assert lam.item() == pytest.approx(0.4)  # falls when under budget


def test_two_sided_lambda_goes_negative_and_pushes_an_under_budget_point_back_up() -> None:
    under = torch.tensor([-0.3])
    lam = T.dual_ascent(torch.zeros(1), under, lr=0.1, two_sided=True)
    assert lam.item() == pytest.approx(-0.03)
    keep_logit = torch.zeros(1, requires_grad=True)
    gap = torch.sigmoid(keep_logit) - 0.8  # expected kept 0.5 against a target of 0.8
    T.lagrangian_penalty(gap, lam).backward()
    assert keep_logit.grad is not None and keep_logit.grad.item() < 0  # descent raises the keep rate


def test_budget_gap_is_normalised_by_real_tokens() -> None:
    expected = torch.tensor([[6.0, 4.0], [20.0, 10.0]])
    target = torch.tensor([[5.0, 3.0], [10.0, 10.0]])
    gap = T.budget_gap(expected, target, torch.tensor([10, 20]))
    torch.testing.assert_close(gap, torch.tensor([(0.1 + 0.5) / 2, (0.1 + 0.0) / 2]))


def test_penalty_gradient_pushes_expected_count_down_when_lambda_positive() -> None:
    expected = torch.tensor([[8.0]], requires_grad=True)
    gap = T.budget_gap(expected, torch.tensor([[5.0]]), torch.tensor([10]))
    T.lagrangian_penalty(gap, torch.tensor([1.0])).backward()
    assert expected.grad is not None and expected.grad.item() > 0


# ----------------------------------------------------------------------------- scorer
def _naive_scores(scorer: S.RetentionScorer, hidden: torch.Tensor) -> torch.Tensor:
    """Per-token loop of the paper's recurrence, for reference."""
    batch, seq_len, width = hidden.shape
    summary = torch.zeros(batch, width)
    scores = []
    for t in range(seq_len):
        pre = scorer.W(hidden[:, t]) + scorer.U(summary)
        scores.append(scorer.v(torch.tanh(pre)).squeeze(-1))
        summary = scorer.ema_decay * summary + (1 - scorer.ema_decay) * hidden[:, t]
    return torch.stack(scores, dim=1)


def test_scorer_matches_the_recurrence_without_a_loop() -> None:
    torch.manual_seed(0)
    scorer = S.RetentionScorer(hidden_size=16, scorer_size=8, ema_decay=0.8)
    hidden = torch.randn(3, 11, 16)
    valid = torch.ones(3, 11, dtype=torch.bool)
    torch.testing.assert_close(scorer(hidden, valid), _naive_scores(scorer, hidden), atol=1e-5, rtol=1e-5)


def test_scorer_summary_is_causal() -> None:
    torch.manual_seed(0)
    scorer = S.RetentionScorer(hidden_size=8, scorer_size=4)
    hidden = torch.randn(1, 6, 8)
    valid = torch.ones(1, 6, dtype=torch.bool)
    changed = hidden.clone()
    changed[:, 4:] += 5.0
    torch.testing.assert_close(scorer(hidden, valid)[:, :4], scorer(changed, valid)[:, :4])


# ----------------------------------------------------------------------------- selection
def test_select_top_tokens_invariants() -> None:
    generator = torch.Generator().manual_seed(0)
    for _ in range(50):
        batch, seq_len = 4, 12
        lengths = torch.randint(2, seq_len + 1, (batch,), generator=generator)
        valid = torch.arange(seq_len).unsqueeze(0) < lengths.unsqueeze(-1)  # (B, T)
        protected = (torch.arange(seq_len) == 0).unsqueeze(0) & valid
        scores = torch.randn(batch, seq_len, generator=generator)
        rho = torch.rand(batch, generator=generator).clamp(min=0.05)
        counts = S.keep_counts(rho, lengths, protected.sum(1), 1)[:, 0]
        index, kept = S.select_top_tokens(S.masked_scores(scores, valid, protected), counts)
        assert torch.equal(kept.sum(1), counts)  # kept counts follow the schedule
        for row in range(batch):
            positions = index[row][kept[row]]
            assert positions[0].item() == 0  # [CLS] kept
            assert torch.all(positions[1:] > positions[:-1])  # original order
            assert torch.all(positions < lengths[row])  # pads never kept
            best = torch.topk(scores[row, 1 : lengths[row]], int(counts[row]) - 1).indices + 1
            assert set(positions[1:].tolist()) == set(best.tolist())  # the highest scores


def test_gather_tokens_shapes() -> None:
    values = torch.arange(2 * 5 * 3, dtype=torch.float32).view(2, 5, 3)
    index = torch.tensor([[0, 2], [1, 4]])
    gathered = S.gather_tokens(values, index)
    assert gathered.shape == (2, 2, 3)
    torch.testing.assert_close(gathered[1, 1], values[1, 4])
    assert S.gather_tokens(torch.arange(10).view(2, 5), index).tolist() == [[0, 2], [6, 9]]


def test_encoder_token_work_counts_last_layer_queries() -> None:
    counts = torch.tensor([[10, 10, 10], [5, 3, 2]])
    num_real = torch.tensor([10, 10])
    work = S.encoder_token_work(counts, num_real, last_layer_queries=None)
    torch.testing.assert_close(work, torch.tensor([1.0, 10 / 30]))
    cls_only = S.encoder_token_work(counts, num_real, last_layer_queries=1)
    torch.testing.assert_close(cls_only, torch.tensor([21 / 30, 9 / 30]))


def _manifest(num_points: int, last_layer_queries: int | None) -> Manifest:
    return Manifest(
        name="token-work",
        task="classification",
        backbone=Backbone(
            name_or_path="tiny",
            family="bert",
            num_layers=num_points,
            hidden_size=8,
            num_heads=2,
            intermediate_size=16,
        ),
        max_length=64,
        default_rho=0.5,
        schedule=Schedule(num_points=num_points, last_layer_queries=last_layer_queries),
        variants={},
        inputs=[],
        outputs=[],
    )


@pytest.mark.parametrize("last_layer_queries", [None, 1])
def test_encoder_token_work_is_the_serving_definition_per_row(last_layer_queries: int | None) -> None:
    """A request's usage (retention_core.usage.token_work) and evaluation's torch form count with the one
    definition (retention_core.schedule.token_layers): they agree on every row."""
    generator = torch.Generator().manual_seed(0)
    num_real = torch.randint(1, 60, (16,), generator=generator)  # (B,)
    fractions = torch.rand(16, 6, generator=generator).sort(dim=1, descending=True).values  # (B, P)
    counts = (fractions * num_real.unsqueeze(-1)).ceil().to(torch.long)  # (B, P) non-increasing, ≥ 1
    per_row = S.encoder_token_work(counts, num_real, last_layer_queries)  # (B,)
    manifest = _manifest(6, last_layer_queries)
    for row in range(16):
        served = token_work(manifest, [int(num_real[row])], counts[row : row + 1].numpy())
        assert per_row[row].item() == pytest.approx(served.fraction, rel=1e-6)


def test_token_work_reports_the_floor_and_the_rows_that_ran_at_it() -> None:
    manifest = _manifest(3, None)
    floored = manifest.model_copy(update={"schedule": Schedule(num_points=3, min_kept_tokens=16)})
    lengths = [4, 40, 40, 200]
    counts = np.array([[4, 4, 4], [30, 20, 16], [38, 36, 34], [100, 60, 40]])  # (R, L)
    work = token_work(floored, lengths, counts)
    assert (work.min_kept_tokens, work.rows_at_floor) == (16, 2)  # the 4-token row and 40 → 16
    assert token_work(manifest, lengths, counts).rows_at_floor == 0  # no floor, nothing at it
    assert work.fraction == token_work(manifest, lengths, counts).fraction  # the floor only shows in counts


@pytest.mark.parametrize("rate", [0.3, 0.5, 0.82])
@pytest.mark.parametrize("spread", [0.5, 2.0, 8.0])
def test_calibrated_shift_keeps_the_budget_in_expectation(rate: float, spread: float) -> None:
    generator = torch.Generator().manual_seed(0)
    scores = torch.randn(3, 64, generator=generator) * spread  # (B, T)
    weights = torch.rand(3, 64, generator=generator)  # soft survival so far
    weights[:, :2] = 0.0  # protected tokens carry no weight, whatever their score
    scores[:, :2] = 1e4
    rates = torch.full((3,), rate)
    logit_rate = torch.logit(rates).unsqueeze(-1)  # (B, 1)

    def expected_share(shift: torch.Tensor) -> torch.Tensor:
        kept = (weights * torch.sigmoid(scores - shift + logit_rate)).sum(1)
        return kept / weights.sum(1)  # (B,)

    calibrated = expected_share(T.calibrated_shift(scores, weights, rates))
    torch.testing.assert_close(calibrated, rates, atol=1e-4, rtol=0.0)
    quantile = expected_share(T.quantile_shift(scores, weights, rates))
    if rate != 0.5:  # the quantile shift misses the budget for unsaturated scores (its docstring)
        assert (quantile - rates).abs().mean() > 0.02


def test_quantile_shift_is_the_weighted_quantile_of_the_candidates() -> None:
    scores = torch.tensor([[4.0, 1.0, 3.0, 2.0, 9.0]])
    weights = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]])  # the last token is protected: no weight
    assert T.quantile_shift(scores, weights, torch.tensor([0.5])).item() == 3.0
    half_alive = torch.tensor([[0.5, 1.0, 0.5, 1.0, 0.0]])  # 4 and 3 half-dropped already
    assert T.quantile_shift(scores, half_alive, torch.tensor([0.5])).item() == 2.0


def test_salient_keep_loss_is_the_mean_negative_log_gate_of_the_salient_tokens() -> None:
    open_prob = torch.tensor([[[0.5, 0.9, 0.2], [0.25, 0.8, 0.1]]])  # (B=1, P=2, T=3)
    salient = torch.tensor([[True, False, False]])  # (B, T)
    expected = -(math.log(0.5) + math.log(0.25)) / 2
    assert T.salient_keep_loss(open_prob, salient).item() == pytest.approx(expected)
    assert T.salient_keep_loss(open_prob, torch.zeros_like(salient)).item() == 0.0
