"""The workflow as an ordinary user: a tiny registration of the Drums arm in the namespace sandbox
(the embedded default's candidate arm), frozen, trained, evaluated and answered by Snakemake
run as a user who is not root (tests/ordinary_user.py), then verified. Every file the run made is
the user's; none needed root. The QEMU arm's guest build still does (debootstrap): not here."""

from __future__ import annotations

import json
import sys

import ordinary_user
import pytest
from conftest import SHIPPED_EXP as EXP
from conftest import an_ordinary_users_workflow

from envab.envs.host import namespaces

pytestmark = [
    pytest.mark.skipif(
        ordinary_user.why_not_here() is not None, reason=str(ordinary_user.why_not_here())
    ),
    pytest.mark.skipif(
        namespaces.namespaces_problem() is not None,
        reason=f"namespace sandbox: {namespaces.namespaces_problem()}",
    ),
]


def test_the_drums_arm_runs_end_to_end_and_verifies_as_an_ordinary_user(make_workflow):
    with an_ordinary_users_workflow(make_workflow) as (home, workflow):
        snakemake = [sys.executable, "-m", "snakemake", "--cores", "2"]
        run = ordinary_user.run(snakemake, home=home, cwd=workflow.root, timeout=1200)
        assert run.returncode == 0, (run.stdout + run.stderr)[-6000:]
        verify = ordinary_user.run(
            [*snakemake[:-2], "--cores", "1", "verify"], home=home, cwd=workflow.root, timeout=600
        )
        assert verify.returncode == 0, (verify.stdout + verify.stderr)[-4000:]
        assert "FAIL" not in verify.stdout + verify.stderr

        outcome = workflow.root / "results" / EXP / "outcome.md"
        assert outcome.is_file()
        uid, _ = ordinary_user.user_ids()
        assert {p.lstat().st_uid for p in workflow.root.rglob("*")} == {uid}  # nothing of root's
        pins = json.loads((workflow.root / "results" / EXP / "drums/seed1/pins.json").read_text())
        assert "namespaces" in json.dumps(pins)  # the arm that ran is the sandbox asked for
