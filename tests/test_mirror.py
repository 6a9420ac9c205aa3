"""The mirror maker (issue 49, item 4): on a machine with network, one command fetches every file
an OSWorld task set names into the layout the freeze's `files.mirror` reads, resumably, naming
each URL it could not take; packed into one tar, unpacked (checked) on a machine without network,
the freeze against it writes the same files.json, tasks and report as a freeze against the file
hosts themselves. The file hosts are a real HTTP server on loopback (test_task_files.Hosts)."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest
from test_task_files import Hosts, freeze, one_download, serve_set, write_set

from envab.envs.osworld import mirror
from envab.envs.osworld.mirror_archive import MirrorError, pack, problems, unpack


@pytest.fixture
def hosts():
    h = Hosts()
    yield h
    h.stop()


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def make(root: Path, out: Path, *extra: str) -> int:
    return mirror.main(["make", "--dir", str(root), "--out", str(out), "--allow-private-hosts",
                        *extra])  # fmt: skip


def task_set(tmp_path: Path, hosts: Hosts) -> Path:
    """test_task_files' three tasks (a set-up download, a postconfig download with a cloud_file
    expectation, a multi cloud_file) and a task whose file the host does not have (404)."""
    serve_set(hosts)
    gone = one_download("gone-1", f"{hosts.url}/gone.txt")
    return write_set(tmp_path / "set", hosts.url, {"vlc": [gone]})


def test_a_mirror_made_packed_and_unpacked_freezes_as_the_file_hosts_do(tmp_path, hosts, capsys):
    root = task_set(tmp_path, hosts)
    made = tmp_path / "made"
    assert make(root, made, "--pack", str(tmp_path / "files.tar")) == 1  # one URL failed
    out, err = capsys.readouterr()
    assert f"not mirrored: {hosts.url}/gone.txt: file:missing: HTTP 404" in err
    assert "(tasks: gone-1)" in err
    assert f"[4/4] {hosts.url}/gone.txt: FAILED file:missing" in err  # progress, one line a URL
    assert "3 of 4 URLs mirrored (3 fetched, 0 already there)" in out
    assert sorted(hosts.gets) == ["/a.txt", "/b.txt", "/c.bin", "/gone.txt"]
    mapped = json.loads((made / "files.json").read_text())
    assert sorted(mapped["files"]) == [f"{hosts.url}/{n}" for n in ("a.txt", "b.txt", "c.bin")]

    # resumable: what is there with its digest is not fetched again
    hosts.gets.clear()
    assert make(root, made) == 1
    assert hosts.gets == ["/gone.txt"]
    assert "3 of 4 URLs mirrored (0 fetched, 3 already there)" in capsys.readouterr().out

    # the archive: its digest beside it, the same mirror packing to the same bytes
    digest = (tmp_path / "files.tar.sha256").read_text().split()[0]
    assert digest == sha((tmp_path / "files.tar").read_bytes())
    assert pack(made, tmp_path / "again.tar") == digest
    brought = tmp_path / "elsewhere" / "osworld-files"
    assert mirror.main(["unpack", "--archive", str(tmp_path / "files.tar"), "--out",
                        str(brought)]) == 0  # fmt: skip
    assert problems(brought) == []

    # the freeze against the file hosts, then without them against the unpacked mirror
    rule = ("--select", '{"runnable": true}')
    assert freeze(root, tmp_path / "online", *rule) == 0
    hosts.stop()
    offline = tmp_path / "offline"
    cfg = json.dumps({"mirror": str(brought)})
    assert freeze(root, offline, *rule, "--files-config", cfg) == 0
    for name in ("files.json", "tasks.jsonl", "index.json"):
        assert (offline / name).read_bytes() == (tmp_path / "online" / name).read_bytes(), name
    report = json.loads((offline / "index.json").read_text())
    assert report["per_task"]["vlc/gone-1"]["reasons"]["xdesktop"] == ["file:missing"]
    assert report["tasks"] == 3


def test_a_file_changed_behind_its_url_is_named_and_the_mirror_keeps_its_bytes(
    tmp_path, hosts, capsys
):
    root = task_set(tmp_path, hosts)
    made = tmp_path / "made"
    assert make(root, made) == 1
    before = (made / "files.json").read_bytes()
    hosts.files["/a.txt"] = b"alpha, edited\n"
    assert make(root, made) == 1  # resumed: nothing fetched again, so nothing seen
    assert "CHANGED" not in capsys.readouterr().err
    assert make(root, made, "--recheck") == 1
    err = capsys.readouterr().err
    line = next(x for x in err.splitlines() if x.startswith(f"not mirrored: {hosts.url}/a.txt"))
    assert "file:changed" in line and sha(b"alpha, edited\n") in line and sha(b"alpha\n") in line
    assert "post-1" in line and "setup-1" in line
    assert (made / "files.json").read_bytes() == before
    assert sorted(p.name for p in (made / "files").iterdir()) == sorted(
        sha(d) for d in (b"alpha\n", b"beta\n", bytes(range(256)))
    )  # the new bytes did not stay

    # against a registered map (a freeze's files.json), a fresh mirror names the change too
    registered = tmp_path / "registered.json"
    registered.write_bytes(before)
    fresh = tmp_path / "fresh"
    assert make(root, fresh, "--expect", str(registered), "--report", str(tmp_path / "r.json")) == 1
    failed = json.loads((tmp_path / "r.json").read_text())["failed"]
    assert failed[f"{hosts.url}/a.txt"]["reason"] == "file:changed"
    assert failed[f"{hosts.url}/gone.txt"]["reason"] == "file:missing"
    assert f"{hosts.url}/a.txt" not in json.loads((fresh / "files.json").read_text())["files"]


def test_private_hosts_are_refused_unless_allowed(tmp_path, hosts, capsys):
    root = task_set(tmp_path, hosts)
    out = tmp_path / "m"
    assert mirror.main(["make", "--dir", str(root), "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.count(": file:private_host:") == 4 and hosts.gets == []


def _archive(tmp_path: Path, members: list[tuple[tarfile.TarInfo, bytes]]) -> Path:
    path = tmp_path / "hostile.tar"
    with tarfile.open(path, "w") as tar:
        for info, data in members:
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def _file(name: str) -> tarfile.TarInfo:
    return tarfile.TarInfo(name)


@pytest.mark.parametrize(
    "case",
    ["outside", "link", "bad_digest", "unnamed", "missing", "digest_of_archive"],
)
def test_unpack_refuses_an_archive_that_is_not_what_it_says_and_writes_nothing(tmp_path, case):
    data = b"alpha\n"
    good_map = json.dumps({"files": {"http://h/a": {"sha256": sha(data), "size": len(data)}},
                           "tasks": {}}).encode()  # fmt: skip
    members = [(_file("files.json"), good_map), (_file(f"files/{sha(data)}"), data)]
    if case == "outside":
        members.append((_file("../escaped"), b"x"))
    elif case == "link":
        link = tarfile.TarInfo(f"files/{sha(b'')}")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        members.append((link, b""))
    elif case == "bad_digest":
        members[1] = (_file(f"files/{sha(data)}"), b"alpha, edited\n")
    elif case == "unnamed":
        members.append((_file(f"files/{sha(b'other')}"), b"other"))
    elif case == "missing":
        members.pop()
    archive = _archive(tmp_path, members)
    out = tmp_path / "out"
    if case == "digest_of_archive":
        (tmp_path / "hostile.tar.sha256").write_text(f"{'0' * 64}  hostile.tar\n")
    with pytest.raises(MirrorError) as e:
        unpack(archive, out)
    assert "hostile.tar" in str(e.value)
    assert not out.exists() and not (tmp_path / "escaped").exists()
    assert {p.name for p in tmp_path.iterdir()} <= {archive.name, "hostile.tar.sha256"}


def test_verify_names_a_mirror_file_whose_bytes_changed(tmp_path, hosts, capsys):
    root = task_set(tmp_path, hosts)
    made = tmp_path / "made"
    make(root, made)
    victim = made / "files" / sha(b"beta\n")
    victim.write_bytes(b"BETA\n")
    assert mirror.main(["verify", "--mirror", str(made)]) == 2
    assert f"{hosts.url}/b.txt: {victim.name} does not hash to its name" in capsys.readouterr().err
    assert mirror.main(["pack", "--mirror", str(made), "--out", str(tmp_path / "x.tar")]) == 2
    assert not (tmp_path / "x.tar").exists()
    # a resumed make takes a file that is not its digest for absent, and fetches it again
    hosts.gets.clear()
    assert make(root, made) == 1
    assert sorted(hosts.gets) == ["/b.txt", "/gone.txt"]
    assert victim.read_bytes() == b"beta\n" and problems(made) == []


def test_a_host_that_does_not_resolve_is_missing_not_private(tmp_path, capsys):
    # .invalid never resolves (RFC 6761): what every file host looks like without network
    root = write_set(tmp_path / "set", "http://files.invalid")
    assert mirror.main(["make", "--dir", str(root), "--out", str(tmp_path / "m")]) == 1
    err = capsys.readouterr().err
    assert err.count(": file:missing: not fetched: 'files.invalid' does not resolve") == 3
    assert "file:private_host" not in err


@pytest.mark.parametrize(
    ("caps", "said"),
    [
        ({"max_file_bytes": 4}, "over the 4 a file may have"),
        ({"max_map_bytes": 10}, "over the 10 a file may have"),
        ({"max_total_bytes": 40}, "bytes a mirror may unpack to"),
        ({"max_members": 1}, "more than 1 members"),
    ],
)
def test_unpack_is_bounded_before_a_byte_is_written(tmp_path, caps, said):
    from envab.envs.osworld.mirror_archive import Caps

    data = b"alpha\n"
    good_map = json.dumps({"files": {"http://h/a": {"sha256": sha(data), "size": len(data)}},
                           "tasks": {}}).encode()  # fmt: skip
    archive = _archive(
        tmp_path, [(_file("files.json"), good_map), (_file(f"files/{sha(data)}"), data)]
    )
    assert unpack(archive, tmp_path / "whole", caps=Caps())  # within the default bounds
    out = tmp_path / "out"
    with pytest.raises(MirrorError, match=said):
        unpack(archive, out, caps=Caps(**caps))
    assert not out.exists()


def test_a_sparse_member_is_refused(tmp_path):
    data = b"alpha\n"
    good_map = json.dumps({"files": {"http://h/a": {"sha256": sha(data), "size": len(data)}},
                           "tasks": {}}).encode()  # fmt: skip
    sparse = _file(f"files/{sha(data)}")
    sparse.type = tarfile.GNUTYPE_SPARSE
    path = tmp_path / "hostile.tar"
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
        tar.addfile(_sized(_file("files.json"), good_map), io.BytesIO(good_map))
        tar.addfile(_sized(sparse, data), io.BytesIO(data))
    with pytest.raises(MirrorError, match="a sparse member"):
        unpack(path, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def _sized(info: tarfile.TarInfo, data: bytes) -> tarfile.TarInfo:
    info.size = len(data)
    return info


def test_a_file_its_url_no_longer_serves_is_taken_from_the_datasets_path_for_its_task(
    tmp_path, hosts, capsys
):
    """OSWorld's later commits keep the set's files in a Hugging Face dataset laid out as
    <domain>/<task id>/<file name>; a URL that fails (a Drive file gone) is looked for there, for
    the task that names it, and kept under the task's URL, which is what the freeze looks up."""
    root = task_set(tmp_path, hosts)  # gone-1 (domain vlc) downloads gone.txt to /root/x
    hosts.files["/cache/vlc/gone-1/x"] = b"the dataset's copy"
    made = tmp_path / "made"
    report = tmp_path / "report.json"
    assert make(root, made, "--dataset", f"{hosts.url}/cache", "--report", str(report)) == 0
    err = capsys.readouterr().err
    assert f"{hosts.url}/gone.txt: fetched 18 bytes from {hosts.url}/cache/vlc/gone-1/x" in err
    entry = json.loads((made / "files.json").read_text())["files"][f"{hosts.url}/gone.txt"]
    assert entry == {"sha256": sha(b"the dataset's copy"), "size": 18}
    assert json.loads(report.read_text())["from_dataset"] == {
        f"{hosts.url}/gone.txt": f"{hosts.url}/cache/vlc/gone-1/x"
    }
    assert "/cache/setup-1" not in " ".join(hosts.gets)  # a URL that answers is never looked up

    # where the dataset lacks it too, the URL's own failure is what is named
    del hosts.files["/cache/vlc/gone-1/x"]
    again = tmp_path / "again"
    assert make(root, again, "--dataset", f"{hosts.url}/cache") == 1
    assert f"not mirrored: {hosts.url}/gone.txt: file:missing: HTTP 404" in capsys.readouterr().err
    assert mirror.dataset_url("https://h/x/", "os", "a b", "n.txt") == "https://h/x/os/a%20b/n.txt"
