"""A files mirror in one archive, for a machine without network: pack, unpack, verify.

A mirror is laid out as the freeze's files (`envs/tasks/filestore.py`): `files.json`, the map
from each URL to {sha256, size}, and `files/<sha256>`. `pack` writes it as one tar holding those
paths only, sorted, with no owner or time (the same mirror packs to the same bytes), and its
sha256 in a `<archive>.sha256` beside it (`sha256sum -c` reads it). The map inside is the
archive's manifest: it names every file's digest, so a file is checked against its name and the
map's size as it comes out.

`unpack` takes the archive as untrusted (it travelled): it checks the archive's digest when
given one (or the `.sha256` beside it), takes only regular files named `files.json` or
`files/<sha256>` (no link, folder, device or other path: nothing lands outside the folder),
hashes each file as it is written, and refuses the lot, writing nothing, on any file whose
bytes are not its name, a file the map names but the archive lacks, or one it has but the map
does not name. Bounded before a byte is written (`Caps`): at most so many members, so many bytes
a file and in all, and no sparse member (a small archive that would unpack to a full disk). The
freeze's `files.mirror` checks each file again when it takes it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from envab.envs.tasks.filestore import MAP, SHA256, STORE, FilesMapError, blob, read_map
from envab.errors import Refusal
from envab.hashing import sha256_file

CHUNK = 2**20
MIB = 2**20


@dataclass(frozen=True)
class Caps:
    """What one unpack may write: the freeze's own bounds on task files by default
    (envs/tasks/fetch.py: Limits), the map at most 64 MiB, at most 100,000 members."""

    max_members: int = 100_000
    max_file_bytes: int = 512 * MIB
    max_total_bytes: int = 8192 * MIB
    max_map_bytes: int = 64 * MIB


class MirrorError(Refusal, ValueError):
    """A mirror folder or archive that is not whole, or not what its map and names say."""


def problems(mirror: str | Path) -> list[str]:
    """What is wrong with the mirror folder (empty: every file its map names is there, with its
    size and digest)."""
    mirror = Path(mirror)
    try:
        files = read_map(mirror / MAP)["files"]
    except FilesMapError as e:
        return [str(e)]
    found = []
    for url, entry in sorted(files.items()):
        path = blob(mirror / STORE, entry["sha256"])
        if not path.is_file():
            found.append(f"{url}: {path.name} is missing")
        elif path.stat().st_size != entry["size"]:
            found.append(f"{url}: {path.name} has {path.stat().st_size} bytes, the map says "
                         f"{entry['size']}")  # fmt: skip
        elif sha256_file(path) != entry["sha256"]:
            found.append(f"{url}: {path.name} does not hash to its name")
    return found


def verify(mirror: str | Path) -> None:
    bad = problems(mirror)
    if bad:
        raise MirrorError(f"{mirror}: " + "; ".join(bad))


def _info(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = size, 0o644, 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def pack(mirror: str | Path, archive: str | Path) -> str:
    """The mirror, verified first, as one tar at `archive`, its sha256 written beside it;
    returns the digest."""
    mirror, archive = Path(mirror), Path(archive)
    verify(mirror)
    files = read_map(mirror / MAP)["files"]
    digests = sorted({e["sha256"] for e in files.values()})
    archive.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{archive.name}.", dir=archive.parent)
    try:
        with (
            os.fdopen(fd, "wb") as raw,
            tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar,
        ):
            map_path = mirror / MAP
            with open(map_path, "rb") as f:
                tar.addfile(_info(MAP, map_path.stat().st_size), f)
            for sha in digests:
                path = blob(mirror / STORE, sha)
                with open(path, "rb") as f:
                    tar.addfile(_info(f"{STORE}/{sha}", path.stat().st_size), f)
        os.replace(tmp, archive)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    digest = sha256_file(archive)
    Path(f"{archive}.sha256").write_text(f"{digest}  {archive.name}\n")
    return digest


def _expected_digest(archive: Path, sha256: str | None) -> str | None:
    if sha256 is not None:
        return sha256.lower()
    side = Path(f"{archive}.sha256")  # sha256sum's form: "<digest>  <name>"
    if side.is_file():
        words = side.read_text().split()
        return words[0].lower() if words else ""
    return None


def unpack(
    archive: str | Path, out: str | Path, sha256: str | None = None, caps: Caps = Caps()
) -> dict:
    """The archive's mirror into `out` (absent or empty), every file checked (see the module's
    docstring); returns its files map. MirrorError, and nothing written, on anything amiss."""
    archive, out = Path(archive), Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise MirrorError(f"{out}: not an empty folder; unpack into a new one")
    want = _expected_digest(archive, sha256)
    if want is not None:
        got = sha256_file(archive)
        if got != want:
            raise MirrorError(f"{archive}: sha256 {got}, expected {want} (changed or cut short "
                              "on the way)")  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        (work / STORE).mkdir()
        taken = _extract(archive, work, caps)
        if MAP not in taken:
            raise MirrorError(f"{archive}: no {MAP} in the archive")
        try:
            files = read_map(work / MAP)["files"]
        except FilesMapError as e:
            raise MirrorError(f"{archive}: {e}") from None
        named = {e["sha256"]: e["size"] for e in files.values()}
        held = {name.split("/", 1)[1] for name in taken if name != MAP}
        if missing := sorted(set(named) - held):
            raise MirrorError(f"{archive}: the map names {len(missing)} file(s) the archive "
                              f"lacks, e.g. {missing[0]}")  # fmt: skip
        if extra := sorted(held - set(named)):
            raise MirrorError(f"{archive}: {len(extra)} file(s) its map does not name, e.g. "
                              f"{extra[0]}")  # fmt: skip
        for sha, size in named.items():
            if (work / STORE / sha).stat().st_size != size:
                raise MirrorError(f"{archive}: {STORE}/{sha} is not the {size} bytes its map says")
        work.chmod(0o755)  # mkdtemp's folder is its owner's alone
        if out.exists():
            out.rmdir()
        os.replace(work, out)
        return files
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise


def _over_caps(member: tarfile.TarInfo, taken: int, total: int, caps: Caps) -> str | None:
    """Why `member` may not be written (None: it may), counted before it is."""
    if member.issparse():
        return "a sparse member (it would unpack larger than it travels)"
    if taken >= caps.max_members:
        return f"more than {caps.max_members} members"
    limit = caps.max_map_bytes if member.name == MAP else caps.max_file_bytes
    if member.size > limit:
        return f"{member.size} bytes, over the {limit} a file may have"
    if total + member.size > caps.max_total_bytes:
        return f"over the {caps.max_total_bytes} bytes a mirror may unpack to"
    return None


def _extract(archive: Path, work: Path, caps: Caps) -> set[str]:
    taken: set[str] = set()
    total = 0
    try:
        tar = tarfile.open(archive, mode="r:")  # noqa: SIM115 (its errors are named apart)
    except (OSError, tarfile.TarError) as e:
        raise MirrorError(f"{archive}: not a tar archive ({e})") from None
    with tar:
        try:
            for member in tar:
                name = member.name
                ok_name = name == MAP or (
                    name.startswith(f"{STORE}/") and SHA256.fullmatch(name[len(STORE) + 1 :])
                )
                if not ok_name or not member.isreg():
                    raise MirrorError(f"{archive}: {name!r} is not {MAP} or a regular file "
                                      f"{STORE}/<sha256>; nothing written")  # fmt: skip
                if name in taken:
                    raise MirrorError(f"{archive}: {name!r} twice; nothing written")
                if over := _over_caps(member, len(taken), total, caps):
                    raise MirrorError(f"{archive}: {name!r}: {over}; nothing written")
                taken.add(name)
                total += member.size
                digest = hashlib.sha256()
                src = tar.extractfile(member)
                with src, open(work / name, "xb") as dst:
                    while chunk := src.read(CHUNK):
                        digest.update(chunk)
                        dst.write(chunk)
                if name != MAP and digest.hexdigest() != name.split("/", 1)[1]:
                    raise MirrorError(f"{archive}: {name} does not hash to its name (sha256 "
                                      f"{digest.hexdigest()}); nothing written")  # fmt: skip
        except tarfile.TarError as e:
            raise MirrorError(f"{archive}: a broken tar archive ({e})") from None
    return taken
