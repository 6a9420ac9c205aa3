"""Shared fixtures: a throw-away copy of the workflow to run real Snakemake in."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
# The shipped experiment, whose receipts and results a copy of the workflow writes: read, not
# written out, so that registering the next version does not leave the tests naming the last.
SHIPPED_TARGET = REPO / "preregistration" / "target.yaml"
SHIPPED_EXP = yaml.safe_load(SHIPPED_TARGET.read_text())["experiment_id"]


def shrink_budget(target: dict, *, valid: int, wall_clock_s: float, interval: int) -> None:
    """A tiny budget and checkpoint interval for a copy of the shipped target. Its controls'
    own budgets are sized for the shipped budget, so they go: each control then trains to the
    tiny budget (a control's own budget has tests of its own, tests/test_controls.py). One
    training seed: a test that runs every registered run trains each arm once."""
    target["budget"].update(max_wall_clock_s=wall_clock_s, max_valid_trajectories=valid)
    target["budget"]["stop_at_target"] = False  # a budget's stop is what these tests pin
    target["seeds"] = target["seeds"][:1]
    target["control_seeds"] = target["seeds"]
    target["evaluation"]["checkpoint_interval"] = interval
    for control in target.get("controls", []):
        control.pop("max_valid_trajectories", None)
    shrink_timing(target, interval)


def one_drums_arm(workflow) -> None:
    """The tests' tiny recipe, the Drums arm alone in its namespace sandbox, one seed, no
    controls, a budget of two GRPO steps."""
    workflow.tiny_recipe()
    arm = {"backend": "drums", "url": "embedded", "mode": "fork", "sandbox": "namespaces",
           "deterministic_screens": True}  # fmt: skip
    workflow.edit_config(lambda c: c.update(arms={"drums": arm}))

    def target(t):
        shrink_budget(t, valid=8, wall_clock_s=900, interval=4)
        t["arms"] = ["drums"]
        t["prices"]["host_usd_per_hour"] = {"drums": 0.10}
        t["evaluation"]["backend"] = "drums"
        t.pop("controls", None)
        t.pop("control_seeds", None)
        t.pop("timing", None)  # the speed blocks need two arms
        t.pop("primary_endpoint", None)

    workflow.edit_target(target)


@contextmanager
def an_ordinary_users_workflow(make_workflow):
    """A home of the ordinary user's own (tests/ordinary_user.py; removed after) holding a
    workflow copy registered by `one_drums_arm`, everything in it theirs: yields (home,
    workflow)."""
    import ordinary_user

    home = Path(tempfile.mkdtemp(prefix="envab-user-"))
    try:
        (home / "workflow").mkdir()
        workflow = make_workflow(home / "workflow")
        one_drums_arm(workflow)
        ordinary_user.own(home)
        yield home, workflow
    finally:
        shutil.rmtree(home, ignore_errors=True)


def keep_timed_controls(target: dict) -> None:
    """Time in the blocks only the timed controls `target` still registers: a copy of the
    shipped target with controls or arms of its own (timed controls: tests/test_timing.py)."""
    if target.get("timing", {}).get("controls"):
        runs = {f"{c['arm']}-{c['name']}" for c in target.get("controls", [])}
        target["timing"]["controls"] = [n for n in target["timing"]["controls"] if n in runs]


def shrink_timing(target: dict, window: int) -> None:
    """Two timing blocks of `window` valid trajectories, where the target registers blocks; the
    tests' other workers share the machine (beside them outside demand passes 1), so no bound on
    demand: no window is refused for the load beside it (the rule itself: tests/test_blocks.py)."""
    if "timing" in target:
        target["timing"].update(
            blocks=2,
            window_valid_trajectories=window,
            max_outside_load=None,
            max_load_difference=None,
            max_steal=1.0,
            max_reruns=0,
            controls=[],  # no control in the blocks: a window each per block (tests/test_timing.py)
        )


os.environ["WANDB_MODE"] = "disabled"  # no wandb files or processes from tests (inherited by jobs)
# What a workflow run needs from the repository (code pins hash these paths too).
WORKFLOW_PATHS = [
    "Snakefile",
    "config.yaml",
    "environment.yaml",
    "rules",
    "schemas",
    "preregistration",
    "report",
    "envab",
    "envs",
    "trainer",
    "eval",
    "analysis",
    "pyproject.toml",
]


def _ignore(_dir, names):
    return {n for n in names if n in ("__pycache__", ".snakemake")}


def copy_workflow(dest: Path) -> Path:
    for name in WORKFLOW_PATHS:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=_ignore)
        elif src.exists():
            shutil.copy2(src, dest / name)
    return dest


@pytest.fixture(scope="session")
def make_workflow():
    """A Workflow in `dest`: a fresh copy of the repository's, or (copy=False) one already there."""
    return lambda dest, copy=True: Workflow(copy_workflow(dest) if copy else dest)


@pytest.fixture
def workflow(tmp_path, make_workflow) -> Workflow:
    return make_workflow(tmp_path)


class Workflow:
    """A copy of the workflow in a temporary directory, run with the real Snakemake CLI."""

    def __init__(self, root: Path):
        self.root = root

    def snakemake(
        self, *args: str, timeout: float = 600, env: dict | None = None
    ) -> subprocess.CompletedProcess:
        """`env`: variables to set for this run and its jobs (e.g. WANDB_MODE=offline). A run
        that fails has the last lines of each failed job's log added to its stderr, where a
        test's assertion message shows them: a CI log then says why, not only which job."""
        result = subprocess.run(
            [sys.executable, "-m", "snakemake", "--cores", "1", *args],
            cwd=self.root,
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, **(env or {})},
        )
        if result.returncode != 0:
            result.stderr += self.failed_logs(result.stderr)
        return result

    def failed_logs(self, stderr: str, lines: int = 15) -> str:
        """The tails of the logs Snakemake names under each failed job ("log: a, b (check
        log file(s) ...)"), each headed by its path."""
        tails = []
        for line in stderr.splitlines():
            line = line.strip()
            if not line.startswith("log: ") or "check log file" not in line:
                continue
            for name in line[len("log: ") :].split(" (check")[0].split(", "):
                path = self.root / name.strip()
                if path.is_file():
                    text = path.read_text(errors="replace").splitlines()[-lines:]
                    tails.append(f"\n--- {name.strip()} (last {len(text)} lines) ---\n")
                    tails.append("\n".join(text))
        return "".join(tails)

    def edit_config(self, update) -> None:
        path = self.root / "config.yaml"
        config = yaml.safe_load(path.read_text())
        update(config)
        path.write_text(yaml.safe_dump(config, sort_keys=False))

    def edit_target(self, update) -> None:
        path = self.root / "preregistration" / "target.yaml"
        target = yaml.safe_load(path.read_text())
        exp = target["experiment_id"]
        update(target)
        keep_timed_controls(target)
        path.write_text(yaml.safe_dump(target, sort_keys=False))
        # Edited before its freeze, the copy registers a variant of its own: the repository's
        # committed anchor of the shipped experiment (envab/anchor.py) is not its anchor. Edited
        # after, the anchor stays, as it would in a clone.
        if not (self.root / "receipts" / exp / "preregistration.json").is_file():
            (path.parent / "anchors" / f"{exp}.json").unlink(missing_ok=True)

    def tiny_recipe(self) -> None:
        """The tests' small recipe: 32 tasks (24 to train on, 8 held out), a warm start of two
        steps, GRPO steps of 2 prompts x 2 generations, one turn of at most 64 tokens."""

        def config(c):
            c["tasks"]["factory"]["per_family"] = 32
            c["training"]["sft"].update(steps=2, batch_size=4)
            c["training"]["grpo"].update(
                num_generations=2, prompts_per_step=2, max_turns=1, max_completion_length=64
            )

        self.edit_config(config)

    def pin_tiny_model(self, experiment_id: str) -> None:
        """Pin the tiny model built for this copy's own task set: its tokenizer is built from
        the training tasks' instructions, so a copy whose tasks differ from the shipped ones
        needs the manifest of its own build (what a user does with `model manifest`)."""
        from envab.trainer import model as pin

        split = f"results/{experiment_id}/tasks/train.jsonl"
        result = self.snakemake(split)
        assert result.returncode == 0, result.stderr[-3000:]
        config = yaml.safe_load((self.root / "config.yaml").read_text())
        source = pin.parse_source(
            config["model"]["source"], pin.spec_from_mapping(config["model"]["spec"])
        )
        built = pin.build_builtin(
            source, pin.read_instructions(self.root / split), self.root / "build" / "tiny-pin"
        )
        manifest = pin.model_manifest(built)
        shutil.rmtree(built)
        self.edit_config(lambda c: c["model"].update(manifest=manifest))

    def embedded_arms(self) -> None:
        """Both arms on the embedded host (a restore per rollout against a fork): the whole
        pipeline without QEMU, fault switches included. The QEMU arm has tests of its own."""
        arms = {
            "restore": {"backend": "drums", "url": "embedded", "mode": "restore"},
            "drums": {"backend": "drums", "url": "embedded", "mode": "fork"},
        }
        self.edit_config(lambda c: c.update(arms=arms))

        def target(t):
            t["arms"] = list(arms)
            t["prices"]["host_usd_per_hour"] = {arm: 0.10 for arm in arms}
            # the shipped controls on an arm these two do not have (qemu's A/A) go
            t["controls"] = [c for c in t.get("controls", []) if c["arm"] in arms]
            t["evaluation"]["backend"] = "restore"

        self.edit_target(target)

    def python(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, *args], cwd=self.root, capture_output=True, text=True, timeout=300
        )


@pytest.fixture(scope="session")
def frozen_once(tmp_path_factory, make_workflow) -> Path:
    """One real freeze of a copy of the workflow (snakemake --cores 1 freeze), shared by the
    session."""
    workflow = make_workflow(tmp_path_factory.mktemp("frozen"))
    result = workflow.snakemake("freeze", timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    return workflow.root


@pytest.fixture
def frozen(frozen_once, tmp_path, make_workflow) -> Workflow:
    """A private copy of the frozen workflow, free to tamper with."""
    root = tmp_path / "wf"
    shutil.copytree(frozen_once, root, symlinks=True)
    for path in root.rglob("*"):  # receipts are write-protected; the tests tamper with them
        path.chmod(path.stat().st_mode | stat.S_IWUSR)
    return make_workflow(root, copy=False)


# The longest files first (minutes each, measured on a 2-core machine: the whole A/B, the X
# desktop's images and its QEMU guest, the training runs, the QEMU guest's build, two training
# processes killed and resumed): pytest-xdist hands whole files to its workers in collection
# order (`--no-loadscope-reorder` in pyproject.toml; its default orders them by their number of
# tests), and a long file handed out last leaves the others idle while one finishes it. Three
# workers on two cores: much of each long file is waiting (a Snakemake job starting, a guest
# booting, a package downloading), which a third worker fills. The rest keep their order.
FIRST = (
    "test_answer.py",
    "test_slurm.py",  # a SLURM cluster's packages, then the small run through it
    "test_rehearsal.py",
    "test_xdesktop.py",
    "test_train.py",
    "test_eval_corruption_run.py",
    "test_multiturn_xdesktop.py",
    "test_agent.py",
    "test_ranks.py",
    "test_ordinary_user.py",  # a registration run as an ordinary user
    "test_judge_confirmation.py",  # a small run, then the judge three times
)


# The two tiers (docs/reference/tests.md). The fast tier, `pytest -m "not integration"`, is the
# inner loop: pure functions, schemas, the split, statistics, the model's forward pass, the
# protocol against in-process or loopback hosts. The integration tier is everything that starts
# Snakemake (any test with a workflow fixture), a gVisor sandbox, a QEMU guest, the X desktop, or
# the pipeline's own command lines as subprocesses: the files below, each minutes or seconds a
# test. CI runs both tiers (the README's test command runs every test).
WORKFLOW_FIXTURES = {"make_workflow", "workflow", "frozen", "frozen_once"}
INTEGRATION_FILES = {
    "test_agent.py",  # both arms, QEMU among them
    "test_answer.py",
    "test_arms.py",
    "test_bad_inputs.py",
    "test_controls.py",
    "test_doc_commands.py",  # every documented command's --help
    "test_factory.py",
    "test_gvisor.py",
    "test_heldout.py",
    "test_host.py",
    "test_machine_load.py",
    "test_model.py",
    "test_multiturn_xdesktop.py",
    "test_outcome.py",
    "test_placement.py",
    "test_profiles.py",
    "test_progress.py",
    "test_qemu.py",
    "test_runc.py",  # an OCI container per environment
    "test_scratch.py",
    "test_setup.py",
    "test_slurm.py",  # a single-node SLURM cluster (cluster/slurm-local)
    "test_templated.py",
    "test_validate.py",
    "test_workflow_lint.py",
    "test_xdesktop.py",
}


# What the whole suite writes under the temporary folder at its peak (a CI-like run on a clean
# clone: about 5 GiB, docs/results/2026-12-07-ci-disk.md), with room for the gVisor sandboxes'
# checkpoints, which refuse to write below 0.5 GiB free (envs/host/gvisor.py MIN_FREE_BYTES).
DISK_NEEDED_GIB = 8


def pytest_report_header(config):
    """The free disk where the tests write, first in the output: with too little, the tests'
    environments fail late in the run as `env_failure` (a checkpoint with no room), which reads
    like a bug of the code under test."""
    import tempfile

    where = tempfile.gettempdir()
    free = shutil.disk_usage(where).free / 2**30
    line = f"disk: {free:.1f} GiB free under {where}"
    if free < DISK_NEEDED_GIB:
        line += (
            f" -- LESS THAN THE {DISK_NEEDED_GIB} GiB THE SUITE NEEDS: environments will fail "
            "(env_failure) once checkpoints find no room; free some space first"
        )
    return line


def pytest_collection_modifyitems(items):
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if item.path.name in INTEGRATION_FILES or fixtures & WORKFLOW_FIXTURES:
            item.add_marker(pytest.mark.integration)
    rank = {name: i for i, name in enumerate(FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(FIRST)))


# OSWorld's own evaluation_examples: a folder named by ENVAB_OSWORLD_EXAMPLES, or else the
# tarball every machine that runs CI keeps beside the checkout (../shared/osworld/).
SHARED_EXAMPLES = sorted(
    (Path(__file__).resolve().parents[2] / "shared" / "osworld").glob("osworld-examples-*.tgz")
)


@pytest.fixture(scope="session")
def osworld_examples(tmp_path_factory) -> Path:
    named = os.environ.get("ENVAB_OSWORLD_EXAMPLES")
    if named:
        return Path(named)
    if not SHARED_EXAMPLES:
        pytest.skip(
            "ENVAB_OSWORLD_EXAMPLES does not name an OSWorld evaluation_examples folder (with "
            "test_all.json) and ../shared/osworld/ holds no osworld-examples-*.tgz, so OSWorld's "
            "own task set is not tried here"
        )
    import tarfile

    into = tmp_path_factory.mktemp("osworld")
    with tarfile.open(SHARED_EXAMPLES[-1]) as archive:
        archive.extractall(into, filter="data")  # plain files and folders only, inside `into`
    return into / "evaluation_examples"


@pytest.fixture(scope="module")
def full_image_pool():
    """A gVisor fork host of the full X desktop image, for a module's plays; skips, saying how
    to build it, where the image is not built (never built by a test: about 400 MB of Debian
    packages) or gVisor cannot run."""
    from envab.envs.host.gvisor import gvisor_problem
    from envab.envs.host.pool import HostConfig, Pool
    from envab.envs.xdesktop.image import cached, ensure_desktop

    cache = REPO / "build" / "xdesktop"
    if gvisor_problem():
        pytest.skip(f"gVisor sandbox: {gvisor_problem()}")
    if not cached(cache, "full"):
        pytest.skip(
            "the full X desktop image is not built (on request only, about 400 MB of Debian "
            "packages): python -m envab.envs.xdesktop.image --image full"
        )
    built = ensure_desktop(cache, image="full")
    pool = Pool(HostConfig(mode="fork", sandbox="gvisor", world="xdesktop", image="full",
                           rootfs=str(built.rootfs), step_timeout_s=60,
                           create_timeout_s=600))  # fmt: skip
    pool.start()
    yield pool
    pool.stop()


def play_on(pool, task: dict, actions: list[dict]) -> dict:
    """One play on `pool`: the task set up, every action stepped (each answer valid), then the
    verdict; the environment closed whatever happens."""
    env = pool.create(task)
    try:
        assert env["valid"], env.get("failed_gates")
        for action in actions:
            env = pool.step(env["env_id"], action, env["generation"])
            assert env["valid"], env
        return pool.verify(env["env_id"])
    finally:
        pool.close(env["env_id"])
