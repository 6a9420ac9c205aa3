"""Programmatic checkers: a task's evaluator and the desktop state read back -> 1.0 or 0.0.

Every checker first applies the task's scope: the values of widgets the task may not change must
hash to `scope.unchanged_sha256` (their values right after set-up), and the episode must not have
ended with FAIL. DONE is not required: an episode that reaches the goal scores 1 whether or not
the agent said DONE. A checker that cannot run (unknown name, missing options, a state without
the widgets it names) raises; it never returns 0 for its own failure.
"""

from __future__ import annotations

from collections.abc import Callable

from envab.envs.desktop.model import values
from envab.hashing import sha256_json

Checker = Callable[[dict, dict, dict], bool]


class CheckerError(ValueError):
    """The checker itself could not run (the host reports "verifier unavailable")."""


def out_of_scope_digest(state: dict, may_change: list[str]) -> str:
    """Digest of the values a task may not change; equal before and after a clean episode."""
    vals = values(state)
    return sha256_json({k: v for k, v in sorted(vals.items()) if k not in set(may_change)})


def _named(options: dict, vals: dict) -> dict:
    expect = options["expect"]
    if not isinstance(expect, dict) or not expect:
        raise CheckerError("options.expect must be a non-empty object of widget id -> value")
    missing = sorted(set(expect) - set(vals))
    if missing:
        raise CheckerError(f"state has no widget {', '.join(missing)}")
    return expect


def values_match(options: dict, state: dict, vals: dict) -> bool:
    """Each named widget holds exactly the expected value."""
    return all(vals[k] == v for k, v in _named(options, vals).items())


def values_in_order(options: dict, state: dict, vals: dict) -> bool:
    """values_match, and the named widgets last changed in the given order."""
    if not values_match(options, state, vals):
        return False
    changed = {w["id"]: w["changed_at"] for w in state["widgets"]}
    if state.get("dialog") is not None:
        changed["dialog"] = state["dialog"]["changed_at"]
    order = options["order"]
    if not isinstance(order, list) or len(order) < 2 or not set(order) <= set(changed):
        raise CheckerError("options.order must list at least two widget ids of the state")
    ticks = [changed[k] for k in order]
    return None not in ticks and all(a < b for a, b in zip(ticks, ticks[1:], strict=False))


CHECKERS: dict[str, Checker] = {
    "values_match": values_match,
    "values_in_order": values_in_order,
}


def check(evaluator: dict, state: dict) -> float:
    """1.0 when the task is done within its scope, else 0.0; raises CheckerError if it can't run."""
    name = evaluator.get("func") if isinstance(evaluator, dict) else None
    if name not in CHECKERS:
        raise CheckerError(f"unknown checker {name!r} (known: {', '.join(CHECKERS)})")
    func = CHECKERS[name]
    try:
        scope = evaluator["scope"]
        vals = values(state)
        in_scope = func(evaluator["options"], state, vals)
        clean = out_of_scope_digest(state, scope["may_change"]) == scope["unchanged_sha256"]
        finished_ok = state["status"] != "fail"
    except CheckerError:
        raise
    except (KeyError, TypeError, AttributeError) as e:
        raise CheckerError(f"checker cannot run: missing or malformed {e}") from None
    return 1.0 if in_scope and clean and finished_ok else 0.0
