"""The freeze's files: every file a selected task downloads, fetched once and stored by content.

Each URL a task names (`envs/tasks/downloads.py`) is fetched once per freeze — from the network,
or from a mirror folder on a machine without one — into `files/<sha256>` beside the frozen task
set, and the URL -> {sha256, size} map is written to `files.json` (`envs/tasks/filestore.py`).
Bounded, since a task file is untrusted: http and https only, redirects only to http or https
(at most MAX_REDIRECTS), at most `max_file_bytes` a file and `max_total_bytes` for the set, and a
total deadline for each fetch.

Google Drive (where most of OSWorld's files live) answers a large file with an HTML page, its
virus-scan warning, not the file: on a Drive host (`DRIVE_HOSTS`) an HTML answer is never stored;
its confirmation form is followed once (`drive_confirmation`), and an HTML answer after that is
refused (`file:drive_page`).

What a task's files can be refused for, by name (the per-task report's reasons): `file:scheme`
(not http or https), `file:missing` (an HTTP error such as 404, no network, not in the mirror),
`file:too_large`, `file:drive_page` (Google Drive answered a page, not the file),
`file:malformed` (a download step or cloud_file getter not in OSWorld's form).
Under a registered rule with `runnable: true` such a task is left out and reported; otherwise it
refuses the freeze (`envs/osworld/source.py`, `select`). A file whose bytes differ from the digest
a registered map expects for its URL (`expect`) always refuses the freeze, naming the task, the
URL and both digests: that is the change the map exists to catch.

A mirror is laid out as a freeze writes its tasks folder: `files.json` and `files/<sha256>`
(copy an earlier freeze's `<results>/<exp>/tasks/`); a URL is looked up in its map and its bytes
checked against the digest before they are stored.
"""

from __future__ import annotations

import contextlib
import hashlib
import html
import html.parser
import http.client
import ipaddress
import os
import shutil
import socket
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from envab.envs.tasks.downloads import SCHEMES, Malformed, downloads, problem
from envab.envs.tasks.filestore import MAP, STORE, blob, read_map, write_map
from envab.envs.tasks.source import SourcedTask, TaskSourceError
from envab.hashing import sha256_file

MIB = 2**20
MAX_REDIRECTS = 5
# Google Drive's hosts: an HTML answer from one is its virus-scan page (or a sign-in page), never
# the file a task names.
DRIVE_HOSTS = frozenset({"drive.google.com", "drive.usercontent.google.com", "docs.google.com"})
DRIVE_PAGE_BYTES = MIB  # the most of a Drive page read to find its confirmation form
CHUNK = MIB
STALL_S = 60.0  # the longest one read may wait for bytes


@dataclass(frozen=True)
class Limits:
    max_file_bytes: int = 512 * MIB
    max_total_bytes: int = 8192 * MIB
    deadline_s: float = 300.0  # one fetch, start to last byte (OSWorld's own timeout)
    # A task file is untrusted: a URL of its (or a redirect) that reaches the freezing machine's
    # own network (loopback, private, link-local such as a cloud's metadata service) would copy
    # what is there into every environment. Refused unless the config allows it (a file mirror
    # on the team's own network; a test's loopback server).
    allow_private_hosts: bool = False

    @classmethod
    def from_config(cls, files: Mapping) -> Limits:
        """`tasks.osworld.files` (config.schema.yaml): max_file_mb, max_total_mb, deadline_s,
        allow_private_hosts."""
        d = cls()
        return cls(
            int(files.get("max_file_mb", d.max_file_bytes // MIB)) * MIB,
            int(files.get("max_total_mb", d.max_total_bytes // MIB)) * MIB,
            float(files.get("deadline_s", d.deadline_s)),
            bool(files.get("allow_private_hosts", d.allow_private_hosts)),
        )


def private_host(url: str) -> str | None:
    """Why `url`'s host is off limits (None: every address it resolves to is public): loopback,
    private, link-local, reserved, multicast or unspecified, also where an IPv6 form carries such
    an IPv4 address; Unfetchable (file:missing) when it does not resolve. Checked again at each
    redirect, and again at each connection, which goes to an address vetted in that same
    resolution (`_PinnedHTTPConnection`): a name that resolves otherwise between the check and the
    connection (DNS rebinding) reaches no private address."""
    host = urlsplit(url).hostname or ""
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except OSError as e:
        # no address to judge, and none to reach: missing (no network, or no such host), not
        # private, which would send the user to the wrong switch
        raise Unfetchable("file:missing", f"not fetched: {host!r} does not resolve ({e})") from None
    for *_, sockaddr in infos:
        address = ipaddress.ip_address(sockaddr[0].split("%", 1)[0])
        for seen in (address, *embedded_ipv4(address)):
            if not seen.is_global or seen.is_multicast:
                return f"{host!r} resolves to {address}, not a public address"
    return None


NAT64 = ipaddress.ip_network("64:ff9b::/96")  # RFC 6052's well-known prefix


def embedded_ipv4(address) -> list:
    """The IPv4 addresses an IPv6 address carries (IPv4-mapped, 6to4, Teredo's server and
    client, NAT64's well-known prefix): a private one there reaches a private host too. Python
    3.11 judges such forms by the IPv6 address alone, and calls some of them global."""
    if address.version != 6:
        return []
    carried = [address.ipv4_mapped, address.sixtofour, *(address.teredo or ())]
    if address in NAT64:
        carried.append(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
    return [a for a in carried if a is not None]


class FileChanged(TaskSourceError):
    """A URL whose bytes are not the ones the registered map expects: always a refusal."""


class Unfetchable(Exception):
    """One URL that cannot be frozen: `reason` is its report name (file:missing, ...)."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason


class _Form(html.parser.HTMLParser):
    """The first form of a page that carries a `confirm` (Drive's download warning): its action
    and hidden fields; or the page's `uc-download-link` (Drive's older page)."""

    def __init__(self):
        super().__init__()
        self.action: str | None = None
        self.fields: dict[str, str] = {}
        self.link: str | None = None
        self._in_form = False
        self._done = False

    def handle_starttag(self, tag, attrs):
        attrs = {k: v or "" for k, v in attrs}
        if self._done:
            return
        if tag == "form":
            self._in_form, self.action, self.fields = True, attrs.get("action"), {}
        elif tag == "input" and self._in_form and attrs.get("name"):
            self.fields[attrs["name"]] = attrs.get("value", "")
        elif tag == "a" and attrs.get("id") == "uc-download-link" and self.link is None:
            self.link = attrs.get("href")

    def handle_endtag(self, tag):
        if tag == "form" and self._in_form:
            self._in_form = False
            self._done = "confirm" in self.fields


def drive_confirmation(page: bytes, base: str) -> str | None:
    """The URL Drive's download-warning page confirms the download at (its form's action with
    its fields, or its download link), resolved against the page's own URL; None where the page
    has neither (a sign-in page, a file that is gone)."""
    form = _Form()
    form.feed(page.decode("utf-8", "replace"))
    if form.action and "confirm" in form.fields:
        return urllib.parse.urljoin(base, form.action) + "?" + urllib.parse.urlencode(form.fields)
    if form.link:
        return urllib.parse.urljoin(base, html.unescape(form.link))
    return None


def _drive_page(reply, url: str) -> bool:
    host = (urlsplit(url).hostname or "").lower()
    kind = reply.headers.get("Content-Type", "")
    return host in DRIVE_HOSTS and kind.split(";", 1)[0].strip().lower() == "text/html"


def _open_file(opener, url: str, wait: float):
    """The reply that carries `url`'s file: Drive's download-warning page followed once, an HTML
    answer from Drive never taken for the file (Unfetchable file:drive_page)."""
    request = urllib.request.Request(url, headers={"User-Agent": "env-ab-freeze"})
    reply = opener.open(request, timeout=wait)
    if not _drive_page(reply, reply.geturl()):
        return reply
    with reply:
        page = reply.read(DRIVE_PAGE_BYTES)
        confirmed = drive_confirmation(page, reply.geturl())
    if confirmed is None or problem(confirmed):
        raise Unfetchable(
            "file:drive_page",
            "Google Drive answered a page, not the file, with no download to confirm (a sign-in "
            "page, or a file that is gone)",
        )
    again = opener.open(
        urllib.request.Request(confirmed, headers={"User-Agent": "env-ab-freeze"}), timeout=wait
    )
    if _drive_page(again, again.geturl()):
        again.close()
        raise Unfetchable(
            "file:drive_page",
            "Google Drive answered a page again after its download was confirmed; nothing stored",
        )
    return again


class PrivateAddress(OSError):
    """A connection refused because the name resolved, when connecting, to a private address."""


def vetted_connection(host: str, port: int, timeout, source_address=None) -> socket.socket:
    """A socket connected to an address `host` resolves to now, every such address vetted as
    public first: the address connected to is the one checked, never a second resolution's."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    error: OSError | None = None
    for family, kind, proto, _, sockaddr in infos:
        address = ipaddress.ip_address(sockaddr[0].split("%", 1)[0])
        if any(not a.is_global or a.is_multicast for a in (address, *embedded_ipv4(address))):
            raise PrivateAddress(f"{host!r} resolves to {address} when connecting, not public")
        sock = socket.socket(family, kind, proto)
        try:
            if timeout is not socket._GLOBAL_DEFAULT_TIMEOUT:
                sock.settimeout(timeout)
            if source_address:
                sock.bind(source_address)
            sock.connect(sockaddr)
            return sock
        except OSError as e:
            error = e
            sock.close()
    raise error or OSError(f"{host!r} resolves to no address")


class _PinnedHTTPConnection(http.client.HTTPConnection):
    def connect(self):
        self.sock = vetted_connection(self.host, self.port, self.timeout, self.source_address)


class _PinnedHTTPSConnection(http.client.HTTPSConnection):
    def connect(self):
        sock = vetted_connection(self.host, self.port, self.timeout, self.source_address)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)


class _PinnedHTTPHandler(urllib.request.HTTPHandler):
    def http_open(self, req):
        if req.has_proxy():  # the proxy the user set resolves the name: vetted by name above
            return super().http_open(req)
        return self.do_open(_PinnedHTTPConnection, req)


class _PinnedHTTPSHandler(urllib.request.HTTPSHandler):
    def https_open(self, req):
        if req.has_proxy():
            return super().https_open(req)
        return self.do_open(_PinnedHTTPSConnection, req, context=self._context)


class _HttpOnlyRedirects(urllib.request.HTTPRedirectHandler):
    max_redirections = MAX_REDIRECTS

    def __init__(self, allow_private_hosts: bool = False):
        super().__init__()
        self.allow_private_hosts = allow_private_hosts

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        bad = problem(newurl) or (None if self.allow_private_hosts else private_host(newurl))
        if bad:
            raise urllib.error.URLError(f"redirected to {bad}")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def _opener(allow_private_hosts: bool = False) -> urllib.request.OpenerDirector:
    """http and https only: no file, ftp or data handler is there to be reached at all."""
    opener = urllib.request.OpenerDirector()
    # Every connection to an address vetted in its own resolution, unless private hosts are
    # allowed (a mirror on this machine's network).
    http_handler, https_handler = (
        (urllib.request.HTTPHandler(), urllib.request.HTTPSHandler())
        if allow_private_hosts
        else (_PinnedHTTPHandler(), _PinnedHTTPSHandler())
    )
    for handler in (
        urllib.request.ProxyHandler(),
        urllib.request.UnknownHandler(),
        http_handler,
        https_handler,
        urllib.request.HTTPDefaultErrorHandler(),
        _HttpOnlyRedirects(allow_private_hosts),
        urllib.request.HTTPErrorProcessor(),
    ):
        opener.add_handler(handler)
    return opener


class Freezer:
    """Fetches (or takes from `mirror`) the files of the tasks it is shown, into `out`'s
    `files/` folder; `expect` is a registered files map (files.json's form) to hold them to."""

    def __init__(
        self,
        out: str | Path,
        *,
        mirror: str | Path | None = None,
        expect: str | Path | None = None,
        limits: Limits = Limits(),
    ):
        self.out, self.limits = Path(out), limits
        # Filled beside the last freeze's store, which `write` replaces only once the set is
        # frozen: a refused freeze leaves what was there.
        self.out.mkdir(parents=True, exist_ok=True)
        self.store = Path(tempfile.mkdtemp(prefix=f".{STORE}.", dir=self.out))
        self.mirror = Path(mirror) if mirror is not None else None
        self.mirrored = read_map(self.mirror / MAP)["files"] if self.mirror else None
        self.expect = read_map(expect)["files"] if expect is not None else {}
        self.expect_path = expect
        self.files: dict[str, dict] = {}  # url -> {sha256, size}: fetched this freeze
        self.refused: dict[str, Unfetchable] = {}  # url -> why not, so it is tried once
        self.tasks: dict[str, list[str]] = {}  # task id -> its URLs (tasks with no problem)
        self.opener = _opener(self.limits.allow_private_hosts)

    # --- per task (the `files` callable `select` calls for each task it would choose) --------

    def __call__(self, t: SourcedTask) -> list[tuple[str, str]]:
        """Why `t`'s files cannot be frozen, as (reason, detail) items naming each URL (empty:
        every file is stored); FileChanged when one differs from the registered map."""
        try:
            wanted = downloads(t.task)
        except Malformed as e:
            return [("file:malformed", str(e))]
        problems, urls = [], []
        for d in wanted:
            try:
                self._url(d.url)
            except Unfetchable as e:
                problems.append((e.reason, f"{d.where}: {d.url}: {e}"))
                continue
            got, want = self.files[d.url]["sha256"], self.expect.get(d.url, {}).get("sha256")
            if want is not None and got != want:
                raise FileChanged(
                    f"{t.origin}: task {t.task['id']}: {d.url} ({d.where}) now has sha256 {got}, "
                    f"the registered map ({self.expect_path}) expects {want}; nothing written"
                )
            urls.append(d.url)
        if not problems and urls:
            self.tasks[t.task["id"]] = urls
        return problems

    def _url(self, url: str) -> None:
        if url in self.refused:
            raise self.refused[url]
        if url in self.files:
            return
        try:
            bad = problem(url)
            if bad:
                raise Unfetchable("file:scheme", bad)
            entry = self._from_mirror(url) if self.mirrored is not None else self._fetch(url)
        except Unfetchable as e:
            self.refused[url] = e
            raise
        self.files[url] = entry
        total = sum(e["size"] for e in {e["sha256"]: e for e in self.files.values()}.values())
        if total > self.limits.max_total_bytes:
            raise TaskSourceError(
                f"the task set's files reach {total} bytes with {url}, over the "
                f"{self.limits.max_total_bytes} bytes a set may hold (tasks.osworld.files."
                "max_total_mb); nothing written"
            )

    def _from_mirror(self, url: str) -> dict:
        entry = self.mirrored.get(url)
        if entry is None:
            raise Unfetchable("file:missing", f"not in the mirror {self.mirror}")
        if entry["size"] > self.limits.max_file_bytes:
            raise Unfetchable("file:too_large", self._too_large(entry["size"]))
        src = blob(self.mirror / STORE, entry["sha256"])
        if not src.is_file() or sha256_file(src) != entry["sha256"]:
            raise Unfetchable("file:missing", f"the mirror's {src} is missing or not its digest")
        size = src.stat().st_size  # the bytes', not the map's word for them
        if size != entry["size"]:
            raise Unfetchable("file:missing", f"the mirror's {src} has {size} bytes, its map says "
                                           f"{entry['size']}")  # fmt: skip
        if size > self.limits.max_file_bytes:
            raise Unfetchable("file:too_large", self._too_large(size))
        dest = blob(self.store, entry["sha256"])
        if not dest.exists():
            shutil.copyfile(src, dest)
        return {"sha256": entry["sha256"], "size": size}

    def _fetch(self, url: str) -> dict:
        return fetch_url(url, self.store, self.limits, self.opener)

    def _too_large(self, size: int, word: str = "") -> str:
        return too_large(size, self.limits, word)

    # --- the freeze's output ----------------------------------------------------------------

    def write(self, chosen: Iterable[str]) -> dict:
        """files.json for the `chosen` task ids, and the store pruned to what it names (a file
        of a task left out is not kept): the map, as the tasks job's report carries it."""
        tasks = {tid: self.tasks[tid] for tid in sorted(chosen) if tid in self.tasks}
        files = {url: self.files[url] for url in sorted({u for us in tasks.values() for u in us})}
        keep = {e["sha256"] for e in files.values()}
        for path in self.store.iterdir():
            if path.name not in keep:
                path.unlink()
        final = self.out / STORE
        if final.exists():
            shutil.rmtree(final)
        self.store.chmod(0o755)  # mkdtemp's folder is its owner's alone
        os.replace(self.store, final)
        self.store = final
        write_map(self.out / MAP, files, tasks)
        return files

    def discard(self) -> None:
        """A refused freeze: its partial store goes."""
        if self.store != self.out / STORE:
            shutil.rmtree(self.store, ignore_errors=True)


def fetch_url(
    url: str, store: Path, limits: Limits, opener: urllib.request.OpenerDirector | None = None
) -> dict:
    """One GET of `url`, within `limits`, streamed to a temporary file in `store` while it is
    hashed and counted, then renamed to `store/<sha256>`: its {sha256, size}, or Unfetchable
    naming why not (the freeze's and the mirror maker's one way to fetch)."""
    bad = problem(url)
    if bad:
        raise Unfetchable("file:scheme", bad)
    where = None if limits.allow_private_hosts else private_host(url)
    if where:
        raise Unfetchable(
            "file:private_host",
            f"not fetched: {where} (a task file may not reach this machine's network; "
            "tasks.osworld.files.allow_private_hosts)",
        )
    opener = opener or _opener(limits.allow_private_hosts)
    deadline = time.monotonic() + limits.deadline_s
    digest, size = hashlib.sha256(), 0
    fd, tmp = tempfile.mkstemp(prefix=".part-", dir=store)
    try:
        with os.fdopen(fd, "wb") as f:
            # the socket's timeout bounds one wait; the deadline is checked after each read
            wait = min(_left(deadline, limits), STALL_S)
            with _open_file(opener, url, wait) as reply:
                length = reply.headers.get("Content-Length")
                if length and length.isdigit() and int(length) > limits.max_file_bytes:
                    raise Unfetchable("file:too_large", too_large(int(length), limits))
                while chunk := reply.read1(CHUNK):  # what one read brought: a drip is counted
                    size += len(chunk)
                    if size > limits.max_file_bytes:
                        raise Unfetchable("file:too_large", too_large(size, limits, "over"))
                    digest.update(chunk)
                    f.write(chunk)
                    _left(deadline, limits)
        entry = {"sha256": digest.hexdigest(), "size": size}
        os.replace(tmp, blob(store, entry["sha256"]))
        return entry
    except urllib.error.HTTPError as e:
        raise Unfetchable("file:missing", f"HTTP {e.code} {e.reason}") from None
    except urllib.error.URLError as e:
        if isinstance(e.reason, PrivateAddress):
            raise Unfetchable("file:private_host", f"not fetched: {e.reason}") from None
        raise Unfetchable("file:missing", f"not fetched ({e.reason})") from None
    except (OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        raise Unfetchable("file:missing", f"not fetched ({reason})") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _left(deadline: float, limits: Limits) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise Unfetchable("file:missing", f"not fetched within {limits.deadline_s} s")
    return left


def too_large(size: int, limits: Limits, word: str = "") -> str:
    said = f"{word} {size}" if word else str(size)
    return (
        f"{said} bytes, over the {limits.max_file_bytes} a file may have "
        "(tasks.osworld.files.max_file_mb)"
    )


def not_frozen(t: SourcedTask) -> list[tuple[str, str]]:
    """Without a freeze of its files, each file `t` downloads is a reason it cannot run: the
    X desktop gets a task's files only from the store (`file:not_frozen`)."""
    try:
        wanted = downloads(t.task)
    except Malformed as e:
        return [("file:malformed", str(e))]
    return [
        (
            "file:not_frozen",
            f"{d.where}: {d.url}: not frozen (the tasks job freezes it with --files)",
        )  # fmt: skip
        for d in wanted
    ]


__all__ = [
    "SCHEMES",
    "FileChanged",
    "Freezer",
    "Limits",
    "Unfetchable",
    "fetch_url",
    "not_frozen",
    "too_large",
]
