"""The one place mccl talks to HiGHS (``highspy``): building a silent model, running it, bases.

Every LP of mccl (the AllToAll master, the compact arc LP, the repair LP, the rounding
LP) goes through this module, so that

- a solver outcome means the same thing everywhere: :func:`run` maps HiGHS's model
  status (a table from status to message, as scipy's ``optimize/_linprog_highs.py``
  does) to :class:`Outcome` ``OPTIMAL``, ``TIME_LIMIT`` or ``ITERATION_LIMIT`` (a limit
  is an outcome the caller plans for, e.g. the master's pivot budget), to
  :class:`~mccl.errors.Infeasible` (the LP has no solution), or to
  :class:`~mccl.errors.SynthesisError` naming any other status;
- the one private name of highspy that mccl uses (``highspy._core._Highs``, see
  :func:`new_model`) is confined here, next to its reason;
- a highspy upgrade is one file to check.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum

import highspy

from mccl.errors import Infeasible, SynthesisError

__all__ = ["BASIC", "INF", "LOWER", "MAX_ITERATIONS", "UPPER", "Outcome", "maximize", "new_model",
           "require_optimal", "run", "set_basis", "set_limits"]

INF = highspy.kHighsInf
MAX_ITERATIONS = 2**31 - 1  # HiGHS's default simplex_iteration_limit (kHighsIInf): none
BASIC, LOWER, UPPER = highspy.HighsBasisStatus.kBasic, highspy.HighsBasisStatus.kLower, highspy.HighsBasisStatus.kUpper


class Outcome(StrEnum):
    """How a solve ended when it did not fail: at the optimum, or stopped by a limit the caller set."""

    OPTIMAL = "optimal"
    TIME_LIMIT = "time"
    ITERATION_LIMIT = "iterations"


_S = highspy.HighsModelStatus
_OUTCOMES = {_S.kOptimal: Outcome.OPTIMAL, _S.kTimeLimit: Outcome.TIME_LIMIT,
             _S.kIterationLimit: Outcome.ITERATION_LIMIT}
# What each failing status means, in the user's terms (after scipy's _linprog_highs status table).
_MESSAGES = {
    _S.kInfeasible: "the LP has no feasible solution",
    _S.kUnbounded: "the LP is unbounded (a capacity row is missing)",
    _S.kUnboundedOrInfeasible: "the LP is unbounded or infeasible",
    _S.kModelEmpty: "the LP has no rows and no columns",
    _S.kModelError: "HiGHS found the model malformed",
    _S.kLoadError: "HiGHS could not load the model",
    _S.kPresolveError: "HiGHS failed in presolve",
    _S.kPostsolveError: "HiGHS failed in postsolve",
    _S.kSolveError: "HiGHS failed while solving (numerical trouble)",
    _S.kMemoryLimit: "HiGHS ran out of memory",
    _S.kInterrupt: "the solve was interrupted",
    _S.kNotset: "HiGHS did not solve the model",
    _S.kUnknown: "HiGHS stopped without a status",
}


def new_model(**options: object) -> highspy.Highs:
    """A silent HiGHS instance with ``options`` set (``setOptionValue`` name → value).

    ``highspy.Highs()`` (1.16) prints a banner on stdout when first built, before any option
    can turn output off; its compiled base class ``highspy._core._Highs`` takes the same calls
    without it. That private name is used only here, and only if it exists.
    """
    cls = getattr(getattr(highspy, "_core", None), "_Highs", highspy.Highs)
    model = cls()
    model.setOptionValue("output_flag", False)
    for name, value in options.items():
        model.setOptionValue(name, value)
    return model


def maximize(model: highspy.Highs) -> None:
    model.changeObjectiveSense(highspy.ObjSense.kMaximize)


def set_limits(model: highspy.Highs, *, time_limit_s: float | None = None, iteration_limit: int | None = None) -> None:
    """Time (s) and simplex-pivot limits of the next solve; None lifts a limit."""
    model.setOptionValue("time_limit", float(time_limit_s) if time_limit_s is not None else INF)
    model.setOptionValue("simplex_iteration_limit", int(iteration_limit) if iteration_limit is not None
                         else MAX_ITERATIONS)


def run(model: highspy.Highs, what: str) -> Outcome:
    """Solve; the :class:`Outcome`, or :class:`Infeasible` / :class:`SynthesisError` naming ``what`` and the status."""
    model.run()
    status = model.getModelStatus()
    outcome = _OUTCOMES.get(status)
    if outcome is not None:
        return outcome
    message = _MESSAGES.get(status, "HiGHS stopped early")
    name = model.modelStatusToString(status)
    if status == _S.kInfeasible:
        raise Infeasible(f"{what} is infeasible: {message} (HiGHS model status {name!r})")
    raise SynthesisError(f"{what} did not solve: {message} (HiGHS model status {name!r})")


def require_optimal(model: highspy.Highs, what: str) -> None:
    """:func:`run`, where a limit that stopped the solve is an error too (the caller has no fallback)."""
    outcome = run(model, what)
    if outcome is not Outcome.OPTIMAL:
        raise SynthesisError(f"{what} did not solve: it stopped at its {outcome.value} limit")


def set_basis(model: highspy.Highs, col_status: Iterable[object], row_status: Iterable[object]) -> bool:
    """Install a basis (statuses as ``HighsBasisStatus`` or their int values); False if HiGHS refuses it."""
    basis = highspy.HighsBasis()
    basis.col_status = _statuses(col_status)
    basis.row_status = _statuses(row_status)
    basis.valid = True
    return model.setBasis(basis) == highspy.HighsStatus.kOk


def _statuses(values: Iterable[object]) -> list[object]:
    """``HighsBasisStatus`` values as a list; a list of them passes as is (the repair LP's crash basis
    has one per route: converting each again cost ~1 ms of a ~8 ms warm AllToAll at 32 GPUs)."""
    values = list(values)
    if all(type(value) is highspy.HighsBasisStatus for value in values):
        return values
    return [highspy.HighsBasisStatus(int(value)) for value in values]
