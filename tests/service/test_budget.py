"""A request's budget (``service.api.budget``) as pure decisions: a fixed arrival, no app, no clock."""

from __future__ import annotations

import pytest

from service.api.budget import Asked, SentFields, decide, due_time
from service.serving import AutoBudget
from service.settings import Settings

SETTINGS = Settings(
    request_timeout_s=30.0,
    auto_latency_target_s=0.25,
    max_latency_target_s=2.0,
    auto_min_rho=0.1,
    auto_max_rho=0.9,
)
ARRIVAL = 100.0
DEFAULT_RHO = 0.4  # the model's


def test_a_fixed_rho_is_due_at_its_deadline_the_shorter_of_the_servers_and_its_own() -> None:
    budget = decide(SETTINGS, Asked(ARRIVAL, rho=0.5), DEFAULT_RHO)
    assert (budget.rho, budget.auto, budget.requested) == (0.5, None, 0.5)
    assert budget.deadline == budget.due.at == ARRIVAL + 30.0 and not budget.due.by_target
    assert budget.target_s is None
    assert decide(SETTINGS, Asked(ARRIVAL, timeout_s=5.0, rho=0.5), DEFAULT_RHO).deadline == ARRIVAL + 5.0
    assert decide(SETTINGS, Asked(ARRIVAL, timeout_s=60.0), DEFAULT_RHO).deadline == ARRIVAL + 30.0


def test_no_rho_is_the_models_default() -> None:
    budget = decide(SETTINGS, Asked(ARRIVAL), DEFAULT_RHO)
    assert (budget.rho, budget.requested, budget.auto) == (DEFAULT_RHO, None, None)


def test_rho_auto_is_due_at_its_target_counted_from_arrival() -> None:
    budget = decide(SETTINGS, Asked(ARRIVAL, rho="auto"), DEFAULT_RHO)
    assert budget.requested == "auto" and budget.rho == 0.9  # its max_rho
    assert budget.auto == AutoBudget(min_rho=0.1, max_rho=0.9, due=ARRIVAL + 0.25)
    assert budget.due.at == ARRIVAL + 0.25 and budget.due.by_target
    assert budget.target_s == 0.25 and budget.deadline == ARRIVAL + 30.0


def test_an_own_target_is_capped_and_a_deadline_sooner_than_the_target_rules() -> None:
    capped = due_time(SETTINGS, Asked(ARRIVAL, rho="auto", target_s=10.0))
    assert capped.target_s == 2.0 and capped.at == ARRIVAL + 2.0
    tight = due_time(SETTINGS, Asked(ARRIVAL, timeout_s=0.1, rho="auto", target_s=1.0))
    assert tight.at == tight.deadline == ARRIVAL + 0.1 and not tight.by_target
    assert tight.auto_due == ARRIVAL + 1.0  # the batcher still aims at the target


def test_max_rho_never_below_the_clients_min_rho() -> None:
    budget = decide(SETTINGS, Asked(ARRIVAL, rho="auto", min_rho=0.95), DEFAULT_RHO)
    assert budget.auto is not None and (budget.auto.min_rho, budget.auto.max_rho) == (0.95, 0.95)
    assert budget.rho == 0.95


def test_the_body_wins_over_the_query_and_max_latency_ms_over_the_header() -> None:
    body = SentFields(rho=None, min_rho=0.3, max_latency_ms=None)
    query = SentFields(rho="auto", min_rho=0.2, max_latency_ms=500.0)
    asked = Asked.of(ARRIVAL, 3.0, 1.5, body, query)
    assert asked == Asked(ARRIVAL, timeout_s=3.0, rho="auto", min_rho=0.3, target_s=0.5)
    own = Asked.of(ARRIVAL, None, 1.5, SentFields(max_latency_ms=200.0), query)
    assert own.target_s == pytest.approx(0.2)
    assert Asked.of(ARRIVAL, None, 1.5, SentFields(rho=0.7), SentFields()).target_s == 1.5  # the header
    assert Asked.of(ARRIVAL, None, None, SentFields(rho=0.7), query).rho == 0.7


def test_the_early_decision_reads_the_same_rule() -> None:
    """Before the body is read the query's rho and target give the due time ``decide`` gives the route
    for a body that adds nothing."""
    query = SentFields(rho="auto", max_latency_ms=400.0)
    early = due_time(SETTINGS, Asked.of(ARRIVAL, None, None, query))
    assert early == decide(SETTINGS, Asked.of(ARRIVAL, None, None, SentFields(), query), DEFAULT_RHO).due
