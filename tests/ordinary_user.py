"""Run a command as an ordinary user, for the tests that show a job needs no root.

A test run as root becomes `USER` (made with `useradd` where missing: no home, no login shell,
no supplementary groups) through util-linux's `setpriv`, with no capabilities left. A test run
by an ordinary user already is one: `why_not_here` says so and the test runs as it is.

The project's Python must be one the user can run. A machine whose Python lives in root's home
(pyenv in root's home folder, 0700, as on this project's CI machines) is shown to the user through a
private mount namespace: an empty 0711 folder over each closed folder on the way, holding only
the paths the run reads (the interpreter's installation, the environment, the checkout). The
user sees those paths and nothing else of root's; everything the run reads and writes is the
same files as root's run."""

from __future__ import annotations

import os
import pwd
import shlex
import shutil
import stat
import subprocess
import sys
from pathlib import Path

USER = "envab-user"
REPO = Path(__file__).resolve().parent.parent


def why_not_here() -> str | None:
    """Why a test cannot switch to an ordinary user here, or None when it can."""
    if os.geteuid() != 0:
        return "already an ordinary user: the tests above ran without root"
    for tool in ("setpriv", "unshare", "useradd"):
        if shutil.which(tool) is None:
            return f"{tool} not found (util-linux, passwd)"
    return None


def user_ids() -> tuple[int, int]:
    """The ordinary user's uid and gid, made on first use."""
    try:
        entry = pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", USER],
            check=True,
            capture_output=True,
        )
        entry = pwd.getpwnam(USER)
    return entry.pw_uid, entry.pw_gid


def own(folder: Path) -> Path:
    """Give `folder` (and everything in it) to the ordinary user."""
    uid, gid = user_ids()
    for path in [folder, *folder.rglob("*")]:
        os.lchown(path, uid, gid)
    return folder


def _closed_parent(path: Path) -> tuple[Path, Path] | None:
    """The first folder above `path` the user cannot pass, and its child on the way."""
    for parent in reversed(path.parents):
        if parent != Path("/") and not os.stat(parent).st_mode & stat.S_IXOTH:
            return parent, path.relative_to(parent).parts[0]
    return None


def _view(paths: list[Path]) -> list[str]:
    """Shell lines, run as root in a private mount namespace, that open each closed folder on
    the way to `paths` to the user as an empty folder holding only those paths' children."""
    lines, shown = [], set()
    for path in paths:
        closed = _closed_parent(path)
        if closed is None or closed in shown:
            continue
        shown.add(closed)
        folder, child = closed
        keep = f"/run/envab-user-view/{len(shown)}"
        lines += [
            f"mkdir -p {keep}",
            f"mount --rbind {shlex.quote(str(folder / child))} {keep}",
            f"mount -t tmpfs -o mode=0711 envab-user-view {shlex.quote(str(folder))}",
            f"mkdir {shlex.quote(str(folder / child))}",
            f"mount --rbind {keep} {shlex.quote(str(folder / child))}",
        ]
    return lines


def view(*reads: Path) -> list[str]:
    """Shell lines, run as root in a private mount namespace, after which the user reaches the
    interpreter, the environment, the checkout and `reads`: for a command of theirs, or for
    daemons that start the user's jobs (a SLURM node's slurmd, whose jobs inherit its mounts)."""
    return _view([Path(sys.base_prefix), Path(sys.prefix), REPO, *reads])


def command(
    argv: list[str], home: Path, env: dict[str, str] | None = None, reads: tuple[Path, ...] = ()
) -> list[str]:
    """`argv` as the ordinary user, with HOME and TMPDIR at `home` (theirs) and a plain
    environment; `reads`: other paths the command reads (the interpreter, the environment and
    the checkout are always there)."""
    uid, gid = user_ids()
    variables = {
        "HOME": str(home),
        "TMPDIR": str(home),  # nothing of the user's left in /tmp
        "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "WANDB_MODE": "disabled",
        **(env or {}),
    }
    become = ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups"]
    become += ["--inh-caps=-all", "--bounding-set=-all", "env", "-i"]
    become += [f"{k}={v}" for k, v in variables.items()]
    script = "\n".join([*view(home, *reads), 'exec "$@"'])
    return ["unshare", "--mount", "--propagation", "private", "sh", "-ec", script, "sh",
            *become, *argv]  # fmt: skip


def run(argv: list[str], home: Path, cwd: Path, timeout: float, env=None, reads=()):
    return subprocess.run(
        command(argv, home, env, tuple(reads)),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def pytest_as_user(test_file: str, keyword: str, timeout: float = 600):
    """`pytest test_file -k keyword` as the ordinary user, in a home of their own (removed
    after), from the checkout: the tests that show a confinement holds for a user, not only for
    root."""
    import tempfile

    home = own(Path(tempfile.mkdtemp(prefix="envab-user-")))
    try:
        return run(
            [sys.executable, "-m", "pytest", test_file, "-n", "0", "-p", "no:cacheprovider",
             "-k", keyword, "--basetemp", str(home / "pytest"), "-q"],
            home=home, cwd=REPO, timeout=timeout,
        )  # fmt: skip
    finally:
        shutil.rmtree(home, ignore_errors=True)
