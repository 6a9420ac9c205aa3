"""The outcome's reading of the cross-arm trace replays (eval/replay.py, the pre-registration's
`replay`): one row per A/B run, and the verdict over them.

Exact divergence shows that the arms served the same training data only where training is
bit-deterministic. The replay does not need that: the actions a run logged, played again on a
fresh environment of every arm, must end as the run recorded them and alike on every arm. A run
whose replay says "differ" is a correctness finding that outranks any speed result, as a
divergence is; a run that logged no actions has nothing to replay and says so.
"""

from __future__ import annotations

from collections.abc import Iterable

from envab.analysis.runs import RunRecords

DIFFER = "differ"
SAME = "same"


def section(runs: Iterable[RunRecords]) -> dict | None:
    """Every replayed run's counts and verdict, and the verdict over them: "differ" where any
    run's does, "same" where every run replayed attempts and each said "same", "not replayed"
    otherwise. None where no run was replayed (no replay registered)."""
    rows = []
    for run in runs:
        if run.replay is None:
            continue
        r = run.replay
        rows.append(
            {
                "run": f"{run.arm}/seed{run.seed}",
                "attempts": r["attempts"],
                "arms": r["arms"],
                "arms_agree": r["arms_agree"],
                "as_recorded": {arm: counts["as_recorded"] for arm, counts in r["per_arm"].items()},
                "verdict": r["verdict"],
                # the attempts that did not end alike: their task and each arm's answer
                "differing": [
                    {
                        "task_id": c["task_id"],
                        "recorded": c["recorded"],
                        "replays": {
                            arm: {k: v for k, v in answer.items() if k != "screens_sha256"}
                            for arm, answer in c["replays"].items()
                        },
                    }
                    for c in r["differing"]
                ],
            }
        )
    if not rows:
        return None
    if any(row["verdict"] == DIFFER for row in rows):
        verdict = DIFFER
    elif all(row["verdict"] == SAME for row in rows):
        verdict = SAME
    else:
        verdict = "not replayed"
    return {"verdict": verdict, "runs": rows}


def lines(replayed: dict) -> list[str]:
    """The outcome's section, in Markdown."""
    out = [
        "## Did the same actions end alike on every arm? (cross-arm trace replay)",
        "",
        "A registered sample of each run's logged attempts, played again with the same actions "
        "on a fresh environment of every arm: each must end as the run recorded it (verdict, "
        "score) and as on every other arm (verdict, failed gates, score, every screen). This "
        "check does not rest on bit-determinism.",
        "",
    ]
    for row in replayed["runs"]:
        n = row["attempts"]
        agreed = (
            f"{row['arms_agree']} of {n} answered alike on {', '.join(row['arms'])}; as "
            "recorded: " + ", ".join(f"{arm} {k} of {n}" for arm, k in row["as_recorded"].items())
        )
        out.append(f"- **{row['run']}**: {row['verdict']} ({agreed})")
        for c in row["differing"][:3]:
            answers = "; ".join(
                f"{arm} {a['verdict']} {a['score']}" for arm, a in c["replays"].items()
            )
            out.append(
                f"  - {c['task_id']}: recorded {c['recorded']['verdict']} "
                f"{c['recorded']['score']}; replayed {answers}"
            )
    if replayed["verdict"] == DIFFER:
        out.append(
            "- **differ — the same actions did not end alike: the environment changed the data "
            "(a correctness finding that outranks any speed result).**"
        )
    out.append("")
    return out


def predicate(replayed: dict | None) -> dict:
    """The outcome receipt's record of each run's replay verdict."""
    return {row["run"]: row["verdict"] for row in (replayed or {}).get("runs", [])}
