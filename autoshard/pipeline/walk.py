"""The pipeline search's walk over recomputation policies, and the refit it defers (branch and bound).

Input: per (degree, microbatches) candidate, a ``price`` callback (one policy, the warm start, the best step
so far, whether its refit may wait) from :mod:`autoshard.pipeline.search`, and the policies in order (none,
selective, full).  Output: a :class:`Walk`: the best candidate, the refusals with their memory floors, and a
line per candidate priced (the plan's notes).

In order, each policy is warm-started by the last plan found; a candidate whose lower bound reaches the best
step is named, not solved; a plan whose budget did not bind ends the walk (recomputing only adds time).

Deferral.  When a policy's stage surrogate fits nothing and no best step is known yet, its refit
(:mod:`autoshard.pipeline.refit`, LLaMA-3 405B's costliest step: ~19 s CPU of a 32 s search, finding nothing)
waits: ``price`` raises :class:`RefitDeferred`, and the walk goes on to the next policies exactly as it goes
on after a refit that finds nothing (no warm start, no best step from it).  Then the refit runs with their best
step as its ceiling: :func:`~autoshard.pipeline.floors.refit_bound` at or above it prunes it, as a known best
step prunes any candidate.  When the refit does run and finds a plan, the candidate's policies are walked
again in order from the state before it (outcomes priced with the same inputs reused), so the answer is the
in-order walk's.  Only the first candidate of the search can defer (later ones know a best step).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from autoshard.errors import InfeasibleError
from autoshard.pipeline.refit import StageMemoryError
from autoshard.problem.costs import Recompute
from autoshard.search import BoundExceeded, Solution

__all__ = ["RefitDeferred", "Walk"]


class Priced(Protocol):
    @property
    def step_seconds(self) -> float: ...
    @property
    def solution(self) -> Solution: ...
    def describe(self) -> str: ...


C = TypeVar("C", bound=Priced)
PriceFn = Callable[[Recompute, tuple[int, ...] | None, float, bool], C | None]


class RefitDeferred(Exception):
    """A candidate's refit postponed (no best step to bound it by yet): ``finish(best step)`` runs it (a
    candidate or None), or raises BoundExceeded when the refit's bound reaches that step."""

    def __init__(self, finish: Callable[[float], object]) -> None:
        super().__init__("refit deferred")
        self.finish = finish


@dataclass(frozen=True)
class _Deferred:
    policy: Recompute
    finish: Callable[[float], object]
    at: tuple[int, int]  # where its lines would have gone: len(errors), len(priced)


@dataclass
class Walk(Generic[C]):
    """The search's running state (module docstring)."""

    best: C | None = None
    errors: list[str] = dataclasses.field(default_factory=list)
    floors: list[StageMemoryError | None] = dataclasses.field(default_factory=list)  # per error
    priced: list[str] = dataclasses.field(default_factory=list)
    ceiling: float = math.inf  # a step to beat from outside the search (a plan already found that fast)
    bounds: list[float] = dataclasses.field(default_factory=list)  # what pruned candidates (proven)

    def above(self) -> BoundExceeded | None:
        """With no candidate found: the least bound that pruned one, when there is a ceiling to report by."""
        if not (self.bounds and math.isfinite(self.ceiling)):
            return None
        return BoundExceeded(min(self.bounds), self.ceiling)

    def candidate(
        self,
        price: PriceFn[C],
        policies: list[Recompute],
        degree: int,
        count: int,
        say: Callable[[str], None],
    ) -> Walk[C]:
        """This state after the policies of ``degree`` stages and ``count`` microbatches."""
        label = f"pp {degree} × {count} microbatches"
        before = dataclasses.replace(
            self, errors=[*self.errors], floors=[*self.floors], priced=[*self.priced], bounds=[*self.bounds]
        )
        known: dict[Recompute, object] = {}
        fitted, deferred = self._policies(price, policies, label, self.best is None, known, say)
        walk = self
        if deferred is not None:
            fitted |= self._finish(deferred, label, known)
            if known.get(deferred.policy) is not None and not isinstance(known[deferred.policy], Exception):
                walk = before  # the refit found a plan: the policies in order, as without deferral
                fitted, _ = walk._policies(price, policies, label, False, known, say)
        if not fitted:
            walk.priced.append(f"{label}: does not fit")
        return walk

    def _policies(
        self,
        price: PriceFn[C],
        policies: list[Recompute],
        label: str,
        defer: bool,
        known: dict[Recompute, object],
        say: Callable[[str], None],
    ) -> tuple[bool, _Deferred | None]:
        """The policies in order; (whether one fitted, the deferred refit).  ``known``: outcomes priced with
        no warm start and no best step (the inputs of a re-walk's first policies), reused."""
        fitted, deferred = False, None
        hint: tuple[int, ...] | None = None  # the last policy's plan warm-starts the next (same graph)
        for policy in policies:
            say("strategies" if policy is policies[0] else "recompute")
            ceiling = self.ceiling if self.best is None else min(self.ceiling, self.best.step_seconds)
            fresh = hint is None and self.best is None
            try:
                if fresh and policy in known:
                    outcome = known[policy]
                    if isinstance(outcome, Exception):
                        raise outcome
                    found: C | None = outcome  # type: ignore[assignment]
                else:
                    later = defer and deferred is None and policy is not policies[-1]
                    found = price(policy, hint, ceiling, later)
                    if fresh:
                        known[policy] = found
            except RefitDeferred as d:
                deferred = _Deferred(policy, d.finish, (len(self.errors), len(self.priced)))
                continue
            except InfeasibleError as e:
                if fresh:
                    known[policy] = e
                self._refused(label, policy, e, len(self.errors))
                continue
            except BoundExceeded as e:  # a lower bound on its step reaches the best plan's: not solved
                self._pruned(label, policy, e, len(self.priced))
                continue
            fitted |= self._offer(found)
            if found is not None:
                hint = found.solution.choice
                if found.solution.budget_binding is False:
                    break  # the budget did not shape the intra-op plan: recomputing only adds time
        return fitted, deferred

    def _finish(self, deferred: _Deferred, label: str, known: dict[Recompute, object]) -> bool:
        """Run (or prune) the deferred refit at the best step now; True when it found a plan (which the
        caller re-walks in order, so it is not offered here)."""
        ceiling = self.ceiling if self.best is None else min(self.ceiling, self.best.step_seconds)
        errors_at, priced_at = deferred.at
        try:
            found = deferred.finish(ceiling)
        except InfeasibleError as e:
            known[deferred.policy] = e
            self._refused(label, deferred.policy, e, errors_at)
            return False
        except BoundExceeded as e:
            self._pruned(label, deferred.policy, e, priced_at)
            return False
        known[deferred.policy] = found
        return found is not None

    def _refused(self, label: str, policy: Recompute, error: InfeasibleError, at: int) -> None:
        self.errors.insert(
            at, f"{label.replace(' × ', ' x ')} ({policy.value}): {error}"
        )  # as the CLI prints it
        self.floors.insert(at, error if isinstance(error, StageMemoryError) else None)

    def _pruned(self, label: str, policy: Recompute, e: BoundExceeded, at: int) -> None:
        self.bounds.append(e.bound)
        line = (
            f"{label} ({policy.value} recompute): at least {e.bound:.5g} s (a proven lower bound), not solved"
        )
        self.priced.insert(at, line)

    def _offer(self, found: C | None) -> bool:
        """Keep ``found`` when strictly faster (ties keep the earlier); True when there is one."""
        if found is None:
            return False
        if self.best is None or found.step_seconds < self.best.step_seconds * (1 - 1e-12):
            self.best = found
        self.priced.append(found.describe())
        return True
