"""The set-up script the README's two commands and CI start with, on a machine of this project's
kind as a new user meets it: root without sudo, or a user with sudo, and package lists that were
never fetched. System tools are stand-ins on a PATH made for the test (they record what they are
asked and fail as the real ones would); the script itself is the real one."""

from __future__ import annotations

import shutil
import stat
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
REAL_TOOLS = ("bash", "dirname", "grep", "env", "cat", "mkdir", "chmod", "touch", "mktemp")


def stub(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def machine(tmp_path):
    """A copy of the script and a PATH with only what a fresh machine has, as stand-ins."""
    bin_dir, home = tmp_path / "bin", tmp_path / "repo"
    bin_dir.mkdir()
    home.mkdir()
    shutil.copy2(REPO / "setup", home / "setup")
    for tool in REAL_TOOLS:
        (bin_dir / tool).symlink_to(shutil.which(tool))
    log = tmp_path / "calls.log"
    # apt-get installs only after `update`, as on a machine that never fetched package lists.
    stub(
        bin_dir,
        "apt-get",
        f'echo "apt-get $*" >> {log}\n'
        'if [ "$1" = update ] || [ "$2" = update ]; then touch ' + str(tmp_path / "lists") + "; "
        "exit 0; fi\n[ -e " + str(tmp_path / "lists") + ' ] || { echo "E: Unable to locate '
        'package" >&2; exit 100; }\n',
    )
    stub(bin_dir, "dpkg-query", "exit 1\n")  # nothing installed yet
    for tool in ("curl", "dpkg"):  # runsc's download and its install
        stub(bin_dir, tool, f'echo "{tool} $*" >> {log}\n')
    # Its check: sha256sum reads the digest from a pipe; a stand-in that never read it could end
    # before the writer wrote, and the writer would die of SIGPIPE (setup exits 141, pipefail).
    stub(bin_dir, "sha256sum", f'echo "sha256sum $*" >> {log}\ncat > /dev/null\n')
    stub(
        bin_dir,
        "python3",
        f'echo "python3 $*" >> {log}\nmkdir -p .venv/bin\n'
        f"printf '#!/bin/bash\\necho \"pip $*\" >> {log}\\n' > .venv/bin/pip\n"
        f"printf '#!/bin/bash\\necho \"python $*\" >> {log}\\n' > .venv/bin/python\n"
        "chmod +x .venv/bin/pip .venv/bin/python\n",
    )

    def run(uid: int, with_sudo: bool = False) -> tuple[subprocess.CompletedProcess, list[str]]:
        stub(bin_dir, "id", f'[ "$1" = -u ] && echo {uid}\n')
        if with_sudo:
            stub(bin_dir, "sudo", f'echo "sudo $1" >> {log}\n"$@"\n')
        result = subprocess.run(
            [str(bin_dir / "bash"), str(home / "setup")],
            env={"PATH": str(bin_dir), "HOME": str(tmp_path)},
            capture_output=True,
            text=True,
            timeout=60,
        )
        return result, log.read_text().splitlines() if log.exists() else []

    return run


def test_as_root_without_sudo_it_updates_then_installs(machine):
    result, calls = machine(uid=0)
    assert result.returncode == 0, result.stderr
    assert calls[0] == "apt-get update -qq"
    assert calls[1] == (
        "apt-get install -y -qq qemu-system-x86 qemu-utils debootstrap curl bubblewrap "
        "libseccomp2 runc"
    )
    # runsc (no runsc on the machine yet): downloaded from Debian's archive, checked, installed
    assert calls[2].startswith("curl -fsSL -o ") and calls[2].endswith(
        "debian/pool/main/g/golang-gvisor-gvisor/runsc_0.0~20240729.0-4+b7_amd64.deb"
    )
    assert calls[3] == "sha256sum -c --quiet -"
    assert calls[4].startswith("dpkg -i ") and calls[4].endswith("_amd64.deb")
    assert calls[5:] == [
        "python3 -m venv .venv",
        "pip install -q -e .[test] -c locks/cpu.txt",
        "pip install -q --no-deps desktop-env==1.0.2",
    ]


def test_as_a_user_it_goes_through_sudo(machine):
    result, calls = machine(uid=1000, with_sudo=True)
    assert result.returncode == 0, result.stderr
    assert calls[:2] == ["sudo apt-get", "apt-get update -qq"]
    assert "sudo env" in calls and any(c.startswith("apt-get install") for c in calls)
    # The QEMU guest, which a user's main job cannot build (debootstrap), built now as root.
    guest = "python -m envab.envs.qemu.image --cache build/qemu"
    assert calls[-2:] == ["sudo .venv/bin/python", guest]


def test_as_a_user_without_sudo_it_says_what_to_do(machine):
    result, calls = machine(uid=1000)
    assert result.returncode != 0
    assert "not root and no sudo" in result.stderr
    assert not any(c.startswith("pip") for c in calls)  # nothing half set up
