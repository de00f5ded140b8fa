"""A request's budget, decided in one place: by when it is due and at what rho it runs.

Every inference route decides it once (``service.api.inference.run`` calls ``decide``) from what the
client asked (``Asked.of``: a body value wins over the query parameter of the same name, the
``x-latency-target`` header comes last) and the model's default rho; early shedding, the batcher and
usage read that one ``Budget``. The refusal before the body is read (``service.api.early``) asks
``due_time`` the same question with what the query and headers say alone.

- The deadline (``deadline_at``): ``request_timeout_s`` after arrival, or the request's
  ``x-request-timeout`` when that is shorter.
- The due time (``due_time``): a fixed rho is due at its deadline; rho=auto at its latency target after
  arrival when that is sooner: its own (``max_latency_ms``, else ``x-latency-target``) capped by
  ``max_latency_target_s``, else ``auto_latency_target_s``. ``service.serving.due_at`` is the rule it
  and the scheduler's ``Job.due`` share.
- The rho (``decide``): a fixed one (the client's, else the model's default), or rho=auto's bounds:
  ``min_rho`` (the client's, else ``auto_min_rho``) and ``max_rho`` (``auto_max_rho``, never below
  ``min_rho``); the batcher picks the rho between them when the request's batch forms.

Pure: no FastAPI, no clock (the arrival is given), so each rule is a unit test
(``tests/service/test_budget.py``). The HTTP layer parses the request (``service.api.deps``) and reads
the result.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from service.serving import AutoBudget, due_at
from service.settings import Settings

T = TypeVar("T")


class Sent(Protocol):
    """The budget fields one source of a request carries: its body (``schemas.InferenceOptions``), its
    query (``deps.QueryOptions``), the query alone before the body is read (``SentFields``)."""

    @property
    def rho(self) -> float | str | None: ...

    @property
    def min_rho(self) -> float | None: ...

    @property
    def max_latency_ms(self) -> float | None: ...


@dataclass(frozen=True)
class SentFields:
    rho: float | str | None = None
    min_rho: float | None = None
    max_latency_ms: float | None = None


def first_set(values: Iterable[T | None]) -> T | None:
    return next((value for value in values if value is not None), None)


@dataclass(frozen=True)
class Asked:
    """What a request asked of its budget, its sources merged."""

    arrival: float  # time.monotonic() it arrived: its deadline and rho=auto target count from it
    timeout_s: float | None = None  # its x-request-timeout
    rho: float | str | None = None  # a number, "auto", or None (the model's default_rho)
    min_rho: float | None = None
    target_s: float | None = None  # rho=auto's own latency target

    @classmethod
    def of(
        cls, arrival: float, timeout_s: float | None, header_target_s: float | None, *sources: Sent
    ) -> Asked:
        """``sources`` in precedence order (the body, then the query); ``header_target_s`` (the
        ``x-latency-target`` header) is the latency target when no source sets ``max_latency_ms``."""
        rho = next((source.rho for source in sources if source.rho is not None), None)
        target_ms = first_set(source.max_latency_ms for source in sources)
        return cls(
            arrival,
            timeout_s,
            rho=rho,
            min_rho=first_set(source.min_rho for source in sources),
            target_s=target_ms / 1000.0 if target_ms is not None else header_target_s,
        )


@dataclass(frozen=True)
class Due:
    """By when a request should be answered (``due_time``)."""

    deadline: float  # time.monotonic(): past it the request fails (504; 429 when none of it ran)
    at: float  # its deadline, or its rho=auto target when sooner
    by_target: bool  # its rho=auto target, not its deadline, is what a late answer would miss
    target_s: float | None = None  # rho=auto: its latency target
    auto_due: float | None = None  # rho=auto: arrival + that target


def deadline_at(settings: Settings, arrival: float, timeout_s: float | None) -> float:
    """A request's deadline (``time.monotonic()``): ``request_timeout_s`` after its arrival, or its
    ``x-request-timeout`` (``timeout_s``) when that is shorter."""
    budget = settings.request_timeout_s
    if timeout_s is not None:
        budget = min(budget, timeout_s)
    return arrival + budget


def due_time(settings: Settings, asked: Asked) -> Due:
    """The one due-time decision, for the route (``decide``) and the refusal before the body is read."""
    deadline = deadline_at(settings, asked.arrival, asked.timeout_s)
    if asked.rho != "auto":
        return Due(deadline, deadline, by_target=False)
    target = settings.auto_latency_target_s
    if asked.target_s is not None:
        target = min(asked.target_s, settings.max_latency_target_s)
    auto_due = asked.arrival + target
    at = due_at(deadline, auto_due)
    return Due(deadline, at, at < deadline, target, auto_due)


@dataclass(frozen=True)
class Budget:
    """The request's one budget decision (``decide``): a fixed rho, or rho=auto's min_rho, max_rho and
    due time."""

    requested: float | str | None  # what the client asked: a number, "auto", None (the model's default)
    rho: float  # fixed: what the graph gets; auto: its max_rho
    due: Due  # by when it should be answered
    auto: AutoBudget | None = None

    @property
    def deadline(self) -> float:
        return self.due.deadline

    @property
    def target_s(self) -> float | None:
        """rho=auto: its latency target."""
        return self.due.target_s


def decide(settings: Settings, asked: Asked, default_rho: float) -> Budget:
    """A fixed rho (the client's, else ``default_rho``: the model's), or rho=auto's min_rho, max_rho and
    due time."""
    due = due_time(settings, asked)
    if asked.rho == "auto":
        min_rho = asked.min_rho if asked.min_rho is not None else settings.auto_min_rho
        max_rho = max(settings.auto_max_rho, min_rho)
        assert due.auto_due is not None
        return Budget(asked.rho, max_rho, due, AutoBudget(min_rho, max_rho, due.auto_due))
    rho = float(asked.rho) if asked.rho is not None else default_rho
    return Budget(asked.rho, rho, due)
