"""The admission rule, the cost model and the batch-time rho controller (``service.scheduling.admission``,
``service.scheduling.cost``) on a fake clock: every function takes ``now``; nothing sleeps."""

from __future__ import annotations

import math
import random

import pytest

from retention_core.contract import Schedule
from service.rates import ArrivalRate
from service.scheduling.admission import (
    REASON_BACKLOG,
    REASON_IDLE,
    REASON_MIN_RHO,
    RHO_GRID,
    Pending,
    admit,
    choose_batch_rho,
    reason_for,
    rho_for,
    run_groups,
    sustainable_rho,
)
from service.scheduling.cost import (
    CostModel,
    TailFactor,
    runs_for,
    schedule_fraction,
    tokens_through,
)

SCHEDULE = Schedule(power=1.0, num_points=6)
BUDGET = 256  # max_batch_tokens


def fraction(rho: float, length: int = 0) -> float:
    return schedule_fraction(SCHEDULE, rho, length)


def truth(tokens: float, kept: float, runs: float = 1.0) -> float:
    """The "machine": 2 ms per run, 10 µs per padded token, 40 µs per kept token."""
    return 0.002 * runs + 1e-5 * tokens + 4e-5 * kept


def trained(
    observations: int = 200, seed: int = 0, scale: float = 1.0, model: CostModel | None = None
) -> CostModel:
    model = model or CostModel(fraction, seed_seconds=0.01, seed_tokens=32)
    rng = random.Random(seed)
    for _ in range(observations):
        tokens = rng.choice([16, 32, 64, 128, 256])
        rho = rng.choice([0.1, 0.3, 0.5, 1.0])
        model.observe(tokens, tokens * fraction(rho), scale * truth(tokens, tokens * fraction(rho)))
    return model


def test_schedule_fraction_is_one_when_dense_and_grows_with_rho() -> None:
    assert schedule_fraction(SCHEDULE, 1.0) == pytest.approx(1.0)
    values = [schedule_fraction(SCHEDULE, rho) for rho in (0.05, 0.1, 0.3, 0.5, 0.7, 1.0)]
    assert values == sorted(values) and values[0] > 0.05  # early layers keep more than rho


def test_cost_model_learns_the_machine_from_its_runs() -> None:
    model = trained()
    for tokens, rho in ((16, 0.1), (256, 1.0), (100, 0.5), (512, 0.3)):
        kept = tokens * fraction(rho)
        runs = runs_for(tokens, BUDGET)
        assert model.predict(runs, tokens, kept) == pytest.approx(truth(tokens, kept, runs), rel=0.02)
    assert model.per_run == pytest.approx(0.002, rel=0.05)
    per_token = [model.per_token(rho) for rho in (0.1, 0.3, 0.5, 0.7, 1.0)]
    assert per_token == sorted(per_token)  # cost never falls as rho grows
    assert model.per_token(1.0) == pytest.approx(5e-5, rel=0.05)


def test_cost_model_follows_a_slower_machine_within_tens_of_runs() -> None:
    model = trained()
    before = model.seconds(256, 1.0, BUDGET)
    trained(60, seed=1, scale=2.0, model=model)  # the machine got twice as slow (other load)
    assert model.seconds(256, 1.0, BUDGET) == pytest.approx(2 * before, rel=0.05)


def test_cost_model_keeps_the_seed_split_for_rhos_it_never_saw() -> None:
    model = CostModel(fraction, seed_seconds=0.01, seed_tokens=32)
    assert model.predict(1, 32, 32 * fraction(1.0)) == pytest.approx(0.01)  # the seed run itself
    for _ in range(50):  # only rho=1 traffic: tokens and kept work move together
        model.observe(128, 128.0, truth(128, 128))
    assert model.seconds(128, 1.0, BUDGET) == pytest.approx(truth(128, 128), rel=0.02)
    assert 0 < model.seconds(128, 0.1, BUDGET) < model.seconds(128, 1.0, BUDGET)
    assert all(c >= 0 for c in model.coefficients)


def test_admission_compares_predicted_completion_with_the_due_time() -> None:
    now = 100.0
    fits = admit(now, due=now + 1.0, wait_s=0.6, own_s=0.3, idle=False)
    assert fits.admit and fits.retry_after_s == 0 and fits.predicted_s == pytest.approx(0.9)
    late = admit(now, due=now + 1.0, wait_s=0.8, own_s=0.3, idle=False)
    assert not late.admit and late.retry_after_s == 1
    # an idle model serves anything: nothing could make it sooner
    assert admit(now, due=now - 5.0, wait_s=0.0, own_s=3.0, idle=True).admit


def test_retry_after_is_the_drain_time_and_never_falls_as_the_backlog_grows() -> None:
    waits = [0.1 * k for k in range(1, 80)]
    retries = [admit(0.0, due=0.05, wait_s=wait, own_s=0.01, idle=False).retry_after_s for wait in waits]
    assert retries == sorted(retries)
    assert retries[0] == 1 and retries[-1] == math.ceil(waits[-1])


def auto(tokens: int, due: float, min_rho: float = 0.1) -> Pending:
    return Pending(tokens, min_rho, 1.0, due, auto=True)


def test_controller_serves_max_rho_when_the_queue_fits() -> None:
    model = trained()
    choice = choose_batch_rho(0.0, [auto(64, due=1.0)], [auto(64, due=1.0)] * 3, model, BUDGET)
    assert choice.candidate == 1.0 and not choice.lowered
    assert reason_for(auto(64, 1.0), rho_for(auto(64, 1.0), choice.candidate)) == REASON_IDLE


def test_controller_lowers_rho_just_enough_for_the_queued_work() -> None:
    model = trained()
    queued = [auto(256, due=0.09)] * 6
    batch = [auto(256, due=0.09)]
    dense = model.seconds(256 * 7, 1.0, BUDGET)
    assert dense > 0.09  # at rho=1 the last queued job would be late
    choice = choose_batch_rho(0.0, batch, queued, model, BUDGET)
    assert 0.1 < choice.candidate < 1.0 and choice.lowered
    assert model.seconds(256 * 7, choice.candidate, BUDGET) <= 0.09  # everyone meets the due time
    higher = min(rho for rho in (1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.25, 0.2) if rho > choice.candidate)
    assert model.seconds(256 * 7, higher, BUDGET) > 0.09  # and the next grid step up would not
    assert reason_for(batch[0], choice.candidate) == REASON_BACKLOG


def test_controller_goes_to_min_rho_when_even_that_is_needed_and_never_below() -> None:
    model = trained()
    min_rho_time = model.seconds(256 * 4, 0.3, BUDGET)
    batch = [auto(256, due=min_rho_time + 1e-4, min_rho=0.3)]
    queued = [auto(256, due=min_rho_time + 1e-4, min_rho=0.3)] * 3
    choice = choose_batch_rho(0.0, batch, queued, model, BUDGET)
    assert choice.candidate == 0.3
    assert reason_for(batch[0], rho_for(batch[0], choice.candidate)) == REASON_MIN_RHO


def test_a_job_already_lost_does_not_drag_the_others_to_min_rho() -> None:
    model = trained()
    hopeless = auto(64, due=-1.0)  # its target passed while it queued
    choice = choose_batch_rho(0.0, [auto(64, due=1.0)], [hopeless, auto(64, due=1.0)], model, BUDGET)
    assert choice.candidate == 1.0
    # itself in the batch, it is served at its min_rho: the least late it can be
    batch = [hopeless, auto(64, due=1.0)]
    assert choose_batch_rho(0.0, batch, [], model, BUDGET).rhos(batch) == [0.1, 1.0]


def test_fixed_rho_jobs_keep_their_rho_and_count_as_work() -> None:
    model = trained()
    fixed = Pending(256, 0.5, 0.5, due=100.0, auto=False)
    assert rho_for(fixed, 0.1) == 0.5
    batch = [auto(64, due=0.03)]
    alone = choose_batch_rho(0.0, batch, [], model, BUDGET)
    assert choose_batch_rho(0.0, batch, [], model, BUDGET).candidate == alone.candidate
    # no auto job in the batch: nothing to decide
    assert not choose_batch_rho(0.0, [fixed], [auto(64, due=0.0)], model, BUDGET).lowered


def test_overload_on_a_fake_clock_sheds_early_and_serves_the_admitted_in_time() -> None:
    """A discrete-event run of admission + controller against a machine that behaves like the cost model,
    batching as the batcher does (jobs in arrival order up to the token budget): arrivals at 3x the
    capacity of rho=1. Admitted requests all finish by their target, the rest are refused on arrival,
    and the served rho falls below 1 under the backlog."""
    model = trained()
    target, tokens = 0.05, 64
    capacity = BUDGET / tokens / model.seconds(BUDGET, 1.0, BUDGET)  # requests / s at rho=1, full runs
    gap = 1.0 / (3 * capacity)
    queue: list[tuple[float, Pending]] = []  # (arrival, job)
    busy_until, served, shed, late = 0.0, [], 0, 0
    for index in range(2000):
        now = index * gap
        while queue and busy_until <= now:  # the worker forms batches until it catches up with the clock
            start = max(busy_until, queue[0][0])
            taken = queue[: BUDGET // tokens]
            del queue[: len(taken)]
            batch = [job for _, job in taken]
            choice = choose_batch_rho(start, batch, [job for _, job in queue], model, BUDGET)
            rhos = [rho_for(job, choice.candidate) for job in batch]
            work = sum(job.tokens * fraction(rho) for job, rho in zip(batch, rhos, strict=True))
            busy_until = start + model.predict(1, len(batch) * tokens, work)
            served += rhos
            late += sum(busy_until > arrival + target + 1e-9 for arrival, _ in taken)
        job = auto(tokens, due=now + target)
        running = max(0.0, busy_until - now)
        queued = len(queue) * tokens
        wait = running + (model.seconds(queued, job.min_rho, BUDGET) if queue else 0.0)
        through = tokens_through(queued + tokens, BUDGET, fill=BUDGET)  # its run fills up behind it
        own = running + model.seconds(through, job.min_rho, BUDGET) - wait
        if admit(now, job.due, wait, own, idle=not queue and busy_until <= now).admit:
            queue.append((now, job))
        else:
            shed += 1
    assert late == 0
    assert shed > 0 and len(served) > 1000
    assert min(served) < 1.0 and max(served) == 1.0


def test_queue_is_cut_into_batches_as_the_batcher_cuts_it_and_runs_fill_up() -> None:
    assert run_groups([100, 100, 100, 300, 50], 256) == [(0, 2), (2, 3), (3, 4), (4, 5)]
    assert run_groups([], 256) == []
    assert tokens_through(300, 256, fill=256) == 512  # the second run fills up behind the job
    assert tokens_through(300, 256, fill=0) == 300  # light load: nothing joins
    assert tokens_through(100, 256, fill=64) == 100


def test_tail_factor_is_a_high_quantile_of_the_recent_overruns_and_never_below_one() -> None:
    tail = TailFactor(window=20, quantile=0.9, min_batches=8)
    for _ in range(7):
        tail.observe(predicted_s=0.1, actual_s=0.5)
    assert tail.value == 1.0  # too few batches to judge
    for _ in range(13):
        tail.observe(predicted_s=0.1, actual_s=0.1)
    assert tail.value == pytest.approx(5.0)  # 7 of 20 overran 5x: the 90th percentile is 5x
    for _ in range(20):
        tail.observe(predicted_s=0.1, actual_s=0.05)  # the window forgets; faster never lowers below 1
    assert tail.value == 1.0
    tail.observe(predicted_s=1e-9, actual_s=10.0)
    assert tail.value == 1.0  # one outlier in 20 is above the 90th percentile
    for _ in range(20):
        tail.observe(predicted_s=0.001, actual_s=10.0)
    assert tail.value == tail.cap  # capped: a broken prediction must not refuse everything forever


def test_controller_lowers_rho_further_when_batches_overrun_their_predictions() -> None:
    model = trained()
    batch, queued = [auto(256, due=0.15)], [auto(256, due=0.15)] * 3
    plain = choose_batch_rho(0.0, batch, queued, model, BUDGET)
    scaled = choose_batch_rho(0.0, batch, queued, model, BUDGET, factor=3.0)
    assert plain.candidate == 1.0 and scaled.candidate < plain.candidate
    assert 3.0 * model.seconds(256 * 4, scaled.candidate, BUDGET) <= 0.15


def simulate_noisy_overload(
    learn_tail: bool, seed: int = 1, overrun: float = 3.0, min_rho_while_shedding: bool = False
) -> tuple[int, int, int]:
    """Admission + controller against a machine whose batches overrun the cost model's prediction
    ``overrun``-fold one time in five (other processes on the same cores), arrivals at 3x the capacity
    of rho=1. ``min_rho_while_shedding``: the batcher's rule (a refusal in the last second puts auto
    batches at their min_rho). Returns (late, admitted, shed)."""
    model = trained()
    tail = TailFactor()
    rng = random.Random(seed)
    target, tokens = 0.05, 64
    capacity = BUDGET / tokens / model.seconds(BUDGET, 1.0, BUDGET)
    gap = 1.0 / (3 * capacity)
    queue: list[tuple[float, Pending]] = []
    busy_until, admitted, shed, late = 0.0, 0, 0, 0
    last_shed = -math.inf
    for index in range(3000):
        now = index * gap
        factor = tail.value if learn_tail else 1.0
        while queue and busy_until <= now:
            start = max(busy_until, queue[0][0])
            taken = queue[: BUDGET // tokens]
            del queue[: len(taken)]
            batch = [job for _, job in taken]
            shedding = min_rho_while_shedding and start - last_shed < 1.0
            queued = [job for _, job in queue]
            choice = choose_batch_rho(start, batch, queued, model, BUDGET, factor, shedding)
            rhos = choice.rhos(batch)
            work = sum(job.tokens * fraction(rho) for job, rho in zip(batch, rhos, strict=True))
            predicted = model.predict(1, len(batch) * tokens, work)
            actual = predicted * (overrun if rng.random() < 0.2 else 1.0)
            tail.observe(predicted, actual)
            busy_until = start + actual
            late += sum(busy_until > arrival + target + 1e-9 for arrival, _ in taken)
        job = auto(tokens, due=now + target)
        running = max(0.0, busy_until - now)
        queued = len(queue) * tokens
        wait = running + (factor * model.seconds(queued, job.min_rho, BUDGET) if queue else 0.0)
        through = tokens_through(queued + tokens, BUDGET, fill=BUDGET)
        own = running + factor * model.seconds(through, job.min_rho, BUDGET) - wait
        if admit(now, job.due, wait, own, idle=not queue and busy_until <= now).admit:
            queue.append((now, job))
            admitted += 1
        else:
            shed += 1
            last_shed = now
    return late, admitted, shed


def test_learning_the_overrun_keeps_admitted_requests_in_time_on_a_noisy_machine() -> None:
    late_plain, admitted_plain, _ = simulate_noisy_overload(learn_tail=False)
    late_tail, admitted_tail, shed_tail = simulate_noisy_overload(learn_tail=True)
    assert late_plain / admitted_plain > 0.05  # the mean-only model admits what the tail then delays
    assert late_tail / admitted_tail < late_plain / admitted_plain / 3
    assert shed_tail > 0 and admitted_tail > 0.25 * admitted_plain  # it still serves, at lower rho


FLOORED = Schedule(power=1.0, num_points=6, min_kept_tokens=16)


def test_the_kept_token_floor_makes_short_rows_cost_the_same_at_every_rho() -> None:
    assert schedule_fraction(FLOORED, 0.1, length=10) == 1.0  # at or under the floor: dense at any rho
    assert schedule_fraction(FLOORED, 0.3, length=16) == 1.0
    long_row = schedule_fraction(FLOORED, 0.1, length=400)
    assert long_row == pytest.approx(schedule_fraction(SCHEDULE, 0.1))  # 400 x frac_p >= 16 everywhere
    middle = schedule_fraction(FLOORED, 0.1, length=40)
    assert schedule_fraction(SCHEDULE, 0.1) < middle < 1.0  # the floor raises only the late points
    assert schedule_fraction(FLOORED, 0.1) == schedule_fraction(SCHEDULE, 0.1)  # length unknown: no floor


def test_controller_knows_lowering_rho_does_not_speed_up_rows_under_the_floor() -> None:
    def floored(rho: float, length: int = 0) -> float:
        return schedule_fraction(FLOORED, rho, length)

    model = trained(model=CostModel(floored, seed_seconds=0.01, seed_tokens=32))
    tokens = 64
    dense = model.seconds(4 * tokens, 1.0, BUDGET)
    due = 0.8 * dense  # late at rho=1; long rows would make it at a lower rho
    long_jobs = [Pending(tokens, 0.1, 1.0, due, True, length=0) for _ in range(4)]
    choice = choose_batch_rho(0.0, long_jobs, [], model, BUDGET)  # one batch: they end together
    assert choice.lowered and not choice.lost
    short_jobs = [Pending(tokens, 0.1, 1.0, due, True, length=12) for _ in range(4)]
    choice = choose_batch_rho(0.0, short_jobs, [], model, BUDGET)
    assert choice.lost == frozenset(range(4))  # no rho makes it: late at min_rho as at rho=1


def test_while_requests_are_refused_auto_batches_run_at_min_rho_and_more_are_admitted() -> None:
    model = trained()
    batch, queued = [auto(64, due=1.0)], [auto(64, due=1.0)] * 2
    assert choose_batch_rho(0.0, batch, queued, model, BUDGET).candidate == 1.0  # the queue fits at 1
    lowest = choose_batch_rho(0.0, batch, queued, model, BUDGET, shedding=True)
    assert lowest.rhos(batch) == [0.1] and reason_for(batch[0], 0.1) == REASON_MIN_RHO
    # 3x overload on the noisy machine, tail learned: degrading before shedding admits more, fewer late
    late_greedy, admitted_greedy, _ = simulate_noisy_overload(learn_tail=True)
    late_lowest, admitted_lowest, _ = simulate_noisy_overload(learn_tail=True, min_rho_while_shedding=True)
    assert admitted_lowest > 1.1 * admitted_greedy
    assert late_lowest <= late_greedy


def test_arrival_rate_follows_a_steady_stream_and_decays_when_it_stops() -> None:
    rate = ArrivalRate(tau_s=0.5)
    assert rate.value(0.0) == 0.0
    for i in range(2000):  # 100 requests/s for 20 s: many time constants
        rate.observe(i / 100)
    assert rate.value(19.99) == pytest.approx(100.0, rel=0.02)
    assert rate.value(19.99 + 0.5) == pytest.approx(100.0 * math.exp(-1), rel=0.02)  # one tau later
    flood = ArrivalRate(tau_s=0.5)
    for i in range(30):  # the first 0.1 s of 300 requests/s
        flood.observe(i / 300)
    assert flood.value(0.1) > 50.0  # already past what one core serves at rho = 1 (~33/s)


def test_sustainable_rho_is_the_highest_rho_the_arrival_rate_can_be_served_at() -> None:
    def seconds(rho: float) -> float:  # 30 ms a request at rho = 1, a third of it fixed
        return 0.01 + 0.02 * rho

    assert sustainable_rho(0.0, seconds) == 1.0 and sustainable_rho(33.0, seconds) == 1.0
    assert sustainable_rho(40.0, seconds) == 0.7  # 40 × (0.01 + 0.02 ρ) ≤ 1 ⇔ ρ ≤ 0.75
    assert sustainable_rho(40.0, seconds, cap=0.9) == 0.6  # ρ ≤ 0.625
    assert sustainable_rho(1000.0, seconds) == RHO_GRID[-1]  # beyond any rho: the lowest


def test_controller_never_goes_above_the_load_bound_nor_below_min_rho() -> None:
    model = trained()
    batch, queued = [auto(64, due=1.0)], [auto(64, due=1.0)] * 3
    assert choose_batch_rho(0.0, batch, queued, model, BUDGET).candidate == 1.0  # the queue alone fits
    capped = choose_batch_rho(0.0, batch, queued, model, BUDGET, load_max_rho=0.4)
    assert capped.candidate == 0.4 and capped.lowered
    lowest = choose_batch_rho(0.0, [auto(64, due=1.0, min_rho=0.3)], [], model, BUDGET, load_max_rho=0.1)
    assert lowest.candidate == 0.3
