"""The `.test` experiment on a real SLURM cluster: a single-node cluster on this machine
(`cluster/slurm-local up`, Debian's slurm-wlm, slurmdbd, munge and MariaDB, installed by the
script where missing), the workflow submitted through `snakemake-executor-plugin-slurm` with
profiles/slurm-local. Every job the plugin submitted is in sacct and COMPLETED, the run's
checkpoint digests are a local run's, and `verify` passes. The cluster goes down at the end
unless it was up before the test."""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import ordinary_user
import pytest
from conftest import SHIPPED_EXP, an_ordinary_users_workflow, copy_workflow

from envab import digests

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "cluster" / "slurm-local"
PROFILE = REPO / "profiles" / "slurm-local"
# What a run writes into `.test`; the copy takes the rest (its config, target, anchors, digests).
RUN_OUTPUTS = {"results", "receipts", "logs", "benchmarks", ".snakemake", "report.html"}
RUN_TIMEOUT_S = 1800  # one run of `.test`: see the test


def why_no_cluster() -> str | None:
    if os.geteuid() != 0:
        return "a SLURM cluster needs root: its daemons run as root (cluster/slurm-local)"
    if shutil.which("apt-get") is None and shutil.which("slurmctld") is None:
        return "no apt-get to install slurm-wlm, slurmdbd, munge and mariadb-server"
    conf = Path("/etc/slurm/slurm.conf")  # the script's link, or a SLURM it must not replace
    ours = Path(os.environ.get("ENVAB_SLURM_DIR", "/run/envab-slurm")) / "slurm.conf"
    ours_there = conf.is_symlink() and Path(os.readlink(conf)) == ours
    if (conf.is_symlink() or conf.exists()) and not ours_there:
        return f"{conf} is another SLURM's: cluster/slurm-local will not replace it"
    return None


def script(action: str, timeout: float, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(SCRIPT), action, *args], capture_output=True, text=True, timeout=timeout
    )


@contextmanager
def one_session_at_a_time(timeout: float = 1800):
    """The cluster is the machine's one (its ports, /etc/slurm/slurm.conf): a second test
    session on this machine, e.g. CI in a clone beside a checkout, waits for the first, which
    would otherwise take the cluster down under the second's jobs."""
    with open(Path(tempfile.gettempdir()) / "envab-slurm-test.lock", "w") as lock:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    pytest.fail(f"another test session held the SLURM cluster for {timeout} s")
                time.sleep(5)
        yield


def up_where_users_reach_python() -> subprocess.CompletedProcess:
    """`cluster/slurm-local up` in a private mount namespace that shows an ordinary user the
    project's interpreter, environment and checkout (tests/ordinary_user.py): the daemons, and so
    every job slurmd starts, inherit it. Nothing changes where those are open to every user
    already; here the interpreter sits in root's 0700 home, as a cluster's never would."""
    lines = ordinary_user.view() if ordinary_user.why_not_here() is None else []
    return subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-ec",
         "\n".join([*lines, 'exec "$@"']), "sh", str(SCRIPT), "up"],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip


@dataclass
class Cluster:
    started_here: bool  # False: it was up before this session, its daemons started elsewhere
    user: str | None  # the ordinary user added to the account, where the session is root's


@pytest.fixture(scope="module")
def cluster():
    reason = why_no_cluster()
    if reason:
        if os.environ.get("CI") == "true":  # CI runs as root on Debian: this must run there
            pytest.fail(reason)
        pytest.skip(reason)
    with one_session_at_a_time():
        was_up = script("status", 60).returncode == 0  # someone's cluster: left up at the end
        up = up_where_users_reach_python()  # a first `up` installs the packages
        if up.returncode != 0 and not was_up:
            script("down", 300)  # what started before the step that failed
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        user = None
        if ordinary_user.why_not_here() is None:
            ordinary_user.user_ids()  # made where missing
            added = script("add-user", 60, ordinary_user.USER)
            assert added.returncode == 0, added.stdout + added.stderr
            user = ordinary_user.USER
        yield Cluster(started_here=not was_up, user=user)
        if not was_up:
            down = script("down", 300)
            assert down.returncode == 0, down.stdout[-3000:] + down.stderr[-3000:]


def small_run_copy(dest: Path) -> Path:
    """The workflow and `.test` as committed, without any run's outputs."""
    dest.mkdir(parents=True)
    copy_workflow(dest)
    shutil.copytree(
        REPO / ".test", dest / ".test", ignore=lambda _d, names: RUN_OUTPUTS & set(names)
    )
    return dest


def snakemake(root: Path, *args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "snakemake", "--directory", ".test", *args],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def sacct(run_id: str) -> dict[str, tuple[str, str]]:
    """Job id -> (state, rule) of every job of one Snakemake run: the plugin names each job
    after the run and comments it with its rule (kept by the cluster: job_comment)."""
    since = f"{datetime.now() - timedelta(days=2):%Y-%m-%dT%H:%M}"  # sacct's default: today
    listing = subprocess.run(
        ["sacct", "-P", "-n", "-X", "--format=JobID,JobName,State,Comment"]
        + ["--starttime", since, "--name", run_id],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert listing.returncode == 0, listing.stderr
    rows = [line.split("|") for line in listing.stdout.splitlines() if line]
    assert rows and all(name == run_id for _, name, _, _ in rows), listing.stdout
    return {job: (state, comment.split("_wildcards_")[0]) for job, _, state, comment in rows}


def test_the_small_run_on_a_single_node_slurm_cluster(cluster, tmp_path):
    root = small_run_copy(tmp_path / "slurm")
    # 264-291 s on a quiet 2-core machine (docs/results/2026-12-05-slurm-single-node.md); 722 s
    # with half the CPU stolen by the machine's host (top: 50 % st), beyond 900 s in CI with the
    # suite's other workers beside it as well.
    run = snakemake(root, "--profile", str(PROFILE), timeout=RUN_TIMEOUT_S)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-6000:]

    # Every job went through SLURM, and sacct (slurmdbd) has each one, COMPLETED.
    run_id = re.search(r"SLURM run ID: (\S+)", out).group(1)
    submitted = re.findall(r"has been submitted with SLURM jobid (\d+)", out)
    assert len(submitted) >= 10, out[-6000:]  # the freeze, sft, train, four evaluations, ...
    jobs = sacct(run_id)
    assert sorted(jobs) == sorted(submitted), (jobs, submitted)
    assert {state for state, _ in jobs.values()} == {"COMPLETED"}, jobs
    rules = [rule for _, rule in jobs.values()]
    assert {"rule_sft", "rule_train", "rule_eval"} <= set(rules), rules
    assert rules.count("rule_eval") >= 2, rules  # an evaluation per checkpoint, each a job

    # The checkpoints are bit for bit a local run's: the digests recorded for this machine kind
    # (.test/digests.yaml), or, where this kind has none, a local run made here.
    check = subprocess.run(
        [sys.executable, "-m", "envab.digests", "check", ".test"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    run_name = "drums/seed1"
    experiment = digests.experiment_of(root / ".test")
    on_slurm = digests.run_digests(
        digests.records_path(root / ".test", {"experiment": experiment, "run": run_name})
    )
    if "checkpoint digests unchanged" in check.stdout:
        assert f"({len(on_slurm)} checkpoints" in check.stdout, check.stdout
    else:
        assert "no digests recorded for this machine kind" in check.stdout, check.stdout
        local_root = small_run_copy(tmp_path / "local")
        local = snakemake(local_root, "--cores", "all", timeout=RUN_TIMEOUT_S)
        assert local.returncode == 0, (local.stdout + local.stderr)[-6000:]
        here = digests.run_digests(
            digests.records_path(local_root / ".test", {"experiment": experiment, "run": run_name})
        )
        assert digests.compare(here, on_slurm) == [], (here, on_slurm)
    assert len(on_slurm) >= 2, on_slurm  # the warm start's checkpoint and GRPO's

    # The run's receipts check out.
    verify = snakemake(root, "--cores", "1", "verify", timeout=600)
    assert verify.returncode == 0, (verify.stdout + verify.stderr)[-6000:]
    counts = re.search(r"verify: (\d+) ok, (\d+) failed", verify.stdout + verify.stderr)
    assert counts and int(counts.group(1)) > 0 and counts.group(2) == "0", verify.stdout[-3000:]


def test_an_ordinary_users_registration_runs_through_slurm_as_that_user(cluster, make_workflow):
    """The SLURM profile as a researcher meets it: not root. A registration of the Drums arm in
    its namespace sandbox (tests/test_ordinary_user.py's; gVisor needs root) submitted through
    profiles/slurm-local by an ordinary user: every job theirs in sacct and COMPLETED, every file
    the run made theirs, and `verify` passes as them."""
    if cluster.user is None:
        pytest.skip(f"no ordinary user to switch to: {ordinary_user.why_not_here()}")
    if not cluster.started_here:
        pytest.skip("the cluster was up before this session: its slurmd may not show the user "
                    "this project's interpreter (see up_where_users_reach_python)")  # fmt: skip
    with an_ordinary_users_workflow(make_workflow) as (home, workflow):
        snakemake = [sys.executable, "-m", "snakemake"]
        run = ordinary_user.run([*snakemake, "--profile", str(PROFILE)], home=home,
                                cwd=workflow.root, timeout=RUN_TIMEOUT_S)  # fmt: skip
        out = run.stdout + run.stderr
        assert run.returncode == 0, out[-6000:]

        run_id = re.search(r"SLURM run ID: (\S+)", out).group(1)
        submitted = re.findall(r"has been submitted with SLURM jobid (\d+)", out)
        assert len(submitted) >= 5, out[-6000:]  # the freeze, sft, train, evaluations, ...
        jobs = sacct(run_id)
        assert sorted(jobs) == sorted(submitted), (jobs, submitted)
        assert {state for state, _ in jobs.values()} == {"COMPLETED"}, jobs
        owners = subprocess.run(
            ["sacct", "-P", "-n", "-X", "--format=User", "--starttime", "now-2days",
             "--name", run_id], capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert set(owners.stdout.split()) == {cluster.user}, owners.stdout + owners.stderr

        verify = ordinary_user.run([*snakemake, "--cores", "1", "verify"], home=home,
                                   cwd=workflow.root, timeout=600)  # fmt: skip
        assert verify.returncode == 0, (verify.stdout + verify.stderr)[-4000:]
        assert (workflow.root / "results" / SHIPPED_EXP / "outcome.md").is_file()
        uid, _ = ordinary_user.user_ids()
        assert {p.lstat().st_uid for p in workflow.root.rglob("*")} == {uid}  # nothing of root's
