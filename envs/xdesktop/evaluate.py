"""Score an OSWorld task on the X desktop the way OSWorld does, with OSWorld's own code.

OSWorld's `DesktopEnv.evaluate` runs the evaluator's `postconfig` set-up steps, then its result
(and expected) getter — `get_<type>(env, config)` from `desktop_env.evaluators.getters`, which
fetch state from the in-environment server through `env.controller` (desktop-env's
`PythonController`), straight over HTTP, or from the browser over its debugging port with
Playwright — and hands them to the metric named by `func` from
`desktop_env.evaluators.metrics`. This does the same: the getters and metrics are desktop-env's
functions, unchanged, and the controller is desktop-env's, talking to a loopback relay (`Relay`)
that carries each request over the environment's channel to its in-environment server (a gVisor
sandbox has no network to reach it on); a task whose getters ask the browser also gets its
debugging port, carried the same way (`envab.envs.xdesktop.debugging`).

The host runs only the `postconfig` steps (set-up the environment executes, sent over its channel)
and `evaluate`; the getters and metrics run in a confined checker process of their own
(`envab.envs.xdesktop.checker`, which calls `preload` and `score` here), with the relay inside
it: a task file names them and the environment writes what they read, so neither is trusted.

desktop-env's packages import every metric's and getter's dependencies in their `__init__`
(OCR, browser automation, cloud drives); a function is loaded from its own module instead, with
the parent packages registered bare (`load`), so only that module's dependencies are needed.
The getters this desktop can serve are `SERVED_GETTERS`; anything else is `Unavailable`.
"""

from __future__ import annotations

import functools
import importlib
import importlib.machinery
import importlib.util
import re
import sys
import tempfile
import threading
import types
import urllib.parse
from collections.abc import Callable, Mapping
from functools import cache
from http.server import ThreadingHTTPServer
from pathlib import Path

from envab.envs.desktop import screen_of as desktop_screen_of
from envab.envs.tasks.evaluators import INFEASIBLE, registry
from envab.envs.tasks.staging import CLOUD_FILE_ROUTE
from envab.envs.xdesktop import apps, checker, cloud_files, debugging
from envab.envs.xdesktop.confine import Limits
from envab.envs.xdesktop.server import SETUP_STEPS, request_handler

BROWSER = "browser"  # the browser's debugging port (debugging.py), not a route of the server
FILE, EXECUTE = "/file", "/execute"
# getter type -> what it reads from the environment: routes of envs/xdesktop/server.py, or
# BROWSER; nothing for one that reads only the task
SERVED_GETTERS: dict[str, tuple[str, ...]] = {
    "vm_file": (FILE,),
    "rule": (),  # the expected value written in the task
    "rule_relativeTime": (),  # a date relative to the checker's clock, from the task's rule
    "time_diff_range": (),
    # what a `postconfig` command printed, kept under the name its step gives (checker.CACHE)
    "cache_file": (),
    "vm_command_line": (EXECUTE,),
    "vm_command_error": (EXECUTE,),
    "list_directory": ("/list_directory",),
    "vm_screen_size": ("/screen_size",),
    # a file, read through vm_file: its text, or the media of a slide in it
    "content_from_vm_file": (FILE,),
    "audio_in_slide": (FILE,),
    "background_image_in_slide": (FILE,),
    # the host answers it from the task set's frozen files, not the environment (files.py)
    "cloud_file": (CLOUD_FILE_ROUTE,),
}
# desktop-env's Chrome getters that read the browser through its debugging port and nothing
# else (`connect_over_cdp`); the others read the accessibility tree, files in the browser's
# profile, or a cloud drive.
CDP_GETTERS = ("open_tabs_info", "page_info", "info_from_website", "pdf_from_url",
               "gotoRecreationPage_and_get_html_content")  # fmt: skip
SERVED_GETTERS |= dict.fromkeys(CDP_GETTERS, (BROWSER,))
# The accessibility tree (the full image's AT-SPI, server.py): the tree itself, and the Chrome
# getters that read the active tab's address from its address bar there
# (`active_url_from_accessTree`), the last two then opening that address over the debugging port.
ACCESSIBILITY = "/accessibility"
TREE_GETTERS = ("accessibility_tree", "active_url_from_accessTree", "active_tab_url_parse",
                "url_dashPart", "url_path_parse", "macys_product_url_parse")  # fmt: skip
SERVED_GETTERS |= dict.fromkeys(TREE_GETTERS, (ACCESSIBILITY,))
SERVED_GETTERS |= dict.fromkeys(("active_tab_info", "active_tab_html_parse"),
                                (ACCESSIBILITY, BROWSER))  # fmt: skip
# desktop-env's getters of an application's own files: they ask the environment for its home
# folder (`execute_python_command`), then read the file (`get_file`). The browser's profile is
# Google Chrome's folder (the full image's launcher puts Chromium's there, envs/xdesktop/image.py).
PROFILE_GETTERS = ("bookmarks", "history", "cookie_data", "default_search_engine",
                   "enable_do_not_track", "enable_enhanced_safety_browsing",
                   "enabled_experiments", "find_installed_extension_name",
                   "find_unpacked_extension_path", "new_startup_page", "profile_name",
                   "data_delete_automacally", "chrome_font_size", "vlc_config",
                   "gimp_config_file")  # fmt: skip
SERVED_GETTERS |= dict.fromkeys(PROFILE_GETTERS, (EXECUTE, FILE))
SERVED_GETTERS["default_video_player"] = (EXECUTE,)  # xdg-mime's answers
# desktop-env's getters that load a page and read what it holds (its HTML, text or title, or a
# file it serves): nothing here reaches a live site, so a task they score on a live page can
# never score as written (`web:<host>`). `active_tab_info` loads the active tab's address again
# (`page.goto`), which fails offline whatever the metric then reads. Those that read addresses
# alone (`active_url_from_accessTree`, `url_dashPart`, `open_tabs_info`'s tabs, ...) can score
# offline: a page that did not load keeps its address.
PAGE_GETTERS = (
    "active_tab_info", "active_tab_html_parse", "page_info", "info_from_website", "pdf_from_url",
    "gotoRecreationPage_and_get_html_content",
)  # fmt: skip
# Set-up steps that open pages in the browser (their addresses under these parameters).
PAGE_STEPS = {"chrome_open_tabs": "urls_to_open", "open": "path", "launch": "command"}
PLATFORM = "Linux"  # what desktop-env's getters pick paths by (`env.vm_platform`): both images
# the in-environment server's routes a checker may ask for: what the served getters read
ROUTES = frozenset(r for reads in SERVED_GETTERS.values() for r in reads if r.startswith("/"))
DEFAULT_SCREEN = (1024, 768)
# A task names its screen, and each size a host has not seen costs a display and a template: a
# task file is untrusted, so the sizes it may ask for are bounded (4K at most; the smallest the
# Pillow desktop draws, so one freeze-time check holds for both worlds' tasks).
MIN_SCREEN, MAX_SCREEN = (64, 64), (3840, 2160)

Http = Callable[[str, str, str, bytes], Mapping]  # (method, path, content type, body) -> reply


class Unavailable(RuntimeError):
    """The evaluator names a getter this desktop does not serve or a metric that cannot load."""


def screen_of(config: list) -> tuple[int, int]:
    """The X desktop's screen: a task's `screen` step within MIN_SCREEN to MAX_SCREEN, or
    DEFAULT_SCREEN (OSWorld's tasks name none; their machine has a fixed one). One rule for both
    desktops (envs/desktop: screen_of), with this desktop's bounds and default."""
    return desktop_screen_of(config, DEFAULT_SCREEN, MIN_SCREEN, MAX_SCREEN)


@cache
def _root() -> Path:
    spec = importlib.util.find_spec("desktop_env")
    return Path(spec.submodule_search_locations[0])


def load(kind: str, name: str):
    """desktop-env's metric (`kind` "metrics") or getter ("getters") `name`, from its module."""
    reg = registry()
    module = reg.modules.get((kind, name))
    if module is None:
        raise Unavailable(f"desktop-env {reg.version} has no {kind[:-1]} {name!r}")
    for package in ("desktop_env", "desktop_env.controllers", "desktop_env.evaluators",
                    f"desktop_env.evaluators.{kind}"):  # fmt: skip
        if package not in sys.modules:  # bare: its __init__ would import everything
            where = str(_root().joinpath(*package.split(".")[1:]))
            bare = types.ModuleType(package)
            bare.__path__ = [where]
            bare.__spec__ = importlib.machinery.ModuleSpec(package, None, is_package=True)
            bare.__spec__.submodule_search_locations = [where]
            sys.modules[package] = bare
    try:
        return getattr(importlib.import_module(f"desktop_env.evaluators.{kind}.{module}"), name)
    except ImportError as e:
        raise Unavailable(f"{kind[:-1]} {name!r} ({module}.py) cannot load here: {e}") from None


def controller_class():
    load("getters", "get_rule")  # registers the bare packages
    return importlib.import_module("desktop_env.controllers.python").PythonController


class Relay:
    """A loopback HTTP server for one evaluation: each request goes to the environment's
    in-environment server through `http` (the host's channel)."""

    def __init__(self, http: Http):
        def relayed(method: str, path: str, content_type: str, body: bytes):
            reply = http(method, path, content_type, body)
            return reply["status"], reply["content_type"], reply["body"]

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), request_handler(relayed))
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Relay:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def _getter(config: Mapping):
    kind = config.get("type")
    if kind not in SERVED_GETTERS:
        raise Unavailable(f"getter {kind!r} reads what this desktop does not serve")
    getter = load("getters", f"get_{kind}")
    if kind == "cloud_file":  # desktop-env's, its files placed in its cache from the store
        return functools.partial(cloud_files.get_cloud_file, getter)
    return getter


# Which applications each image has (envs/xdesktop/apps.py); the base image's, for callers that
# name none.
APP_OF, APPS_HERE = apps.APP_OF, apps.APPS[apps.DEFAULT_IMAGE]


def apps_missing(task: Mapping, image: str = apps.DEFAULT_IMAGE) -> list[str]:
    """The applications `task` names (`related_apps`) that the desktop's `image` lacks."""
    return apps.apps_missing(task, image)


def blockers(task: Mapping, image: str = apps.DEFAULT_IMAGE) -> list[tuple[str, str]]:
    """What in `task` this desktop cannot run or score, one (reason, detail) item each: a
    set-up step it has no route for (`setup:<type>`, `postconfig:<type>`), a metric whose
    module cannot load here (`metric:<name>`), a getter it does not serve (`getter:<type>`:
    one that reads the accessibility tree is served by apps.TREE_IMAGES only),
    a live site whose page content a getter reads (`web:<host>`, `live_pages`), an application
    its `image` (apps.IMAGES) lacks (`app:<name>`)."""
    ev = task.get("evaluator") or {}
    gaps = []
    for where, name, steps in (
        ("config", "setup", task.get("config")),
        ("postconfig", "postconfig", ev.get("postconfig")),
    ):
        for step in steps or []:
            if step.get("type") not in (*SETUP_STEPS, "screen"):
                gaps.append(
                    (
                        f"{name}:{step.get('type')}",
                        f"{where} step {step.get('type')!r} has no route on this desktop",
                    )
                )
            params = step.get("parameters")
            params = params if isinstance(params, Mapping) else {}
            said = f"{where} step {step.get('type')!r}"
            if "until" in params:  # OSWorld runs the command again until it holds; this does not
                gaps.append((f"{name}:until", f"{said} waits on `until`, which is not run here"))
            for key in ("stdout", "stderr"):
                printed = params.get(key)
                if printed is not None and not _plain_name(printed):
                    why = f"{said} prints into {str(printed)[:60]!r}, not a plain file name"
                    gaps.append((f"{name}:{key}", why))
    funcs = ev.get("func")
    for func in funcs if isinstance(funcs, list) else [funcs]:
        if func == INFEASIBLE:  # scored from the agent's last action (by_final_action)
            continue
        try:
            load("metrics", func)
        except Unavailable as e:
            gaps.append((f"metric:{func}", str(e)))
    for key, getter in _getters(ev):
        kind = getter.get("type")
        if kind not in SERVED_GETTERS:
            why = "reads what this desktop does not serve"
        elif ACCESSIBILITY in SERVED_GETTERS[kind] and image not in apps.TREE_IMAGES:
            why = f"reads the accessibility tree, which the {image} image does not carry"
        elif kind == "cache_file" and not _plain_name(path := getter.get("path")):
            why = f"reads {str(path)[:60]!r}, not a plain file name"
        elif kind == "cache_file" and path not in printed_files(ev):
            why = f"reads {str(path)[:60]!r}, which no postconfig step prints"
        else:
            continue
        gaps.append((f"getter:{kind}", f"{key} getter {kind!r} {why}"))
    gaps += live_pages(task)
    for app in apps_missing(task, image):
        gaps.append((f"app:{app}", f"application {app!r} (related_apps) is not in the {image} "
                                   "image"))  # fmt: skip
    return gaps


def live_pages(task: Mapping) -> list[tuple[str, str]]:
    """`web:<host>` for each live site whose page content a getter of `task` reads: the address
    the getter names, else those the set-up opens (`web:page` where neither names one: the page
    the agent is to open). None where no getter reads a page's content, or every page it can
    read is this machine's."""
    readers = [(key, g) for key, g in _getters(task.get("evaluator") or {})
               if g.get("type") in PAGE_GETTERS]  # fmt: skip
    if not readers:
        return []
    opened = []
    for step in task.get("config") or []:
        params = step.get("parameters") if isinstance(step.get("parameters"), Mapping) else {}
        opened += _addresses(params.get(PAGE_STEPS.get(step.get("type"), ""), ""))
    gaps = []
    for key, getter in readers:
        kind = getter.get("type")
        addresses = _addresses(getter.get("url", "")) or opened
        # no address at all: the page the agent is to open; addresses of this machine only: none
        hosts = _live_hosts(addresses) if addresses else ["page"]
        for host in hosts:
            why = (
                f"{key} getter {kind!r} reads the content of a live page ({host}), unreachable here"
            )
            gaps.append((f"web:{host}", why))
    return gaps


# file:// pages count as addresses: they are the machine's own (no host), never a live site
_ADDRESS = re.compile(r"(?:https?|file)://[^\s\"'<>]+")
LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1", "0.0.0.0"}


def _addresses(value) -> list[str]:
    """Every http(s) or file address in a parameter (a string, or strings nested in lists)."""
    if isinstance(value, str):
        return _ADDRESS.findall(value)
    if isinstance(value, list):
        return [a for v in value for a in _addresses(v)]
    return []


def _live_hosts(addresses: list[str]) -> list[str]:
    """The hosts of `addresses` that are not this machine's, each once, in order."""
    hosts = (urllib.parse.urlsplit(a).hostname for a in addresses)
    return list(dict.fromkeys(h for h in hosts if h and h not in LOCAL_HOSTS))


def unavailable(task: Mapping) -> list[str]:
    """What in `task` this desktop cannot run or score (`blockers`), one readable item each:
    the freeze refuses such a task (`python -m envab.envs.osworld --runnable xdesktop`),
    or leaves it out under a registered rule that selects runnable tasks only."""
    return [detail for _, detail in blockers(task)]


def printed_files(ev: Mapping) -> set[str]:
    """The cache files the evaluator's `postconfig` commands print into (their `stdout` and
    `stderr` names, each a plain file name: checker.CACHE_NAME)."""
    names = set()
    for step in ev.get("postconfig") or []:
        params = step.get("parameters") if isinstance(step, Mapping) else None
        if step.get("type") in ("execute", "command") and isinstance(params, Mapping):
            names |= {params.get(k) for k in ("stdout", "stderr") if _plain_name(params.get(k))}
    return names


def read_files(ev: Mapping) -> set[str]:
    """The cache files the evaluator's `cache_file` getters read."""
    return {g["path"] for _, g in _getters(ev) if g.get("type") == "cache_file"
            and _plain_name(g.get("path"))}  # fmt: skip


def _plain_name(name) -> bool:
    return isinstance(name, str) and checker.CACHE_NAME.match(name) is not None


def _getters(ev: Mapping) -> list[tuple[str, Mapping]]:
    """The evaluator's result and expected getters as written (one, or a list, each), with the
    key each is under."""
    found = []
    for key in ("result", "expected"):
        value = ev.get(key)
        found += [(key, g) for g in (value if isinstance(value, list) else [value])
                  if isinstance(g, Mapping)]  # fmt: skip
    return found


def asks_browser(evaluator: Mapping) -> bool:
    """Whether a getter of `evaluator` reads the browser over its debugging port (the host asks,
    before the checker runs: it reads the task as data only)."""
    types = [g.get("type") for _, g in _getters(evaluator)]
    return any(isinstance(t, str) and BROWSER in SERVED_GETTERS.get(t, ()) for t in types)


def evaluate(
    evaluator: Mapping,
    http: Http,
    postconfig: Callable[[list], Mapping[str, bytes] | None],
    limits: Limits | None = None,
    browser: debugging.Turn | None = None,
) -> float:
    """The task's score, as OSWorld's DesktopEnv.evaluate computes it (`score`): the
    `postconfig` steps run here, through the environment's channel (what their commands printed
    under a name, `stdout`, comes back for the checker's cache); the getters and metrics run
    in a confined checker process (`checker.run`) that reaches the environment only through
    `http`, on `ROUTES`, and through `browser` (turns of a stream to the browser's debugging
    port) when a getter asks the browser. `checker.CheckerFailed` when it gives no valid
    score."""
    printed = postconfig(list(evaluator["postconfig"])) if evaluator.get("postconfig") else None
    if evaluator.get("func") == INFEASIBLE:
        raise Unavailable("an infeasible task is scored from the agent's last action")
    port = browser if asks_browser(evaluator) else None
    if isinstance(printed, Mapping):  # only what a getter reads: the rest is nobody's to check
        wanted = read_files(evaluator)
        printed = {n: v for n, v in printed.items() if n in wanted}
    return checker.run(evaluator, http, ROUTES, limits, browser=port, cache=printed)


def by_final_action(evaluator: Mapping, last_action: str | None) -> float | None:
    """OSWorld's rule on the agent's last action (DesktopEnv.evaluate): an infeasible task
    scores 1 when the agent's last action was FAIL and 0 otherwise; a feasible one scores 0 when
    it was FAIL, whatever its metric would say. None: the metric decides."""
    if evaluator.get("func") == INFEASIBLE:
        return 1.0 if last_action == "FAIL" else 0.0
    return 0.0 if last_action == "FAIL" else None


def _parts(evaluator: Mapping) -> list[tuple]:
    """(metric name, result getter, expected getter or None, options), one per metric."""
    funcs = evaluator["func"]
    if funcs == INFEASIBLE:
        raise Unavailable("an infeasible task is scored from the agent's last action")
    many = isinstance(funcs, list)
    funcs = funcs if many else [funcs]
    results = evaluator["result"] if many else [evaluator["result"]]
    expected = evaluator.get("expected")
    expected = (expected if many else [expected]) if expected is not None else [None] * len(funcs)
    options = evaluator.get("options", [{}] * len(funcs) if many else {})
    options = options if many else [options]
    return list(zip(funcs, results, expected, options, strict=True))


def preload(evaluator: Mapping) -> None:
    """Import the metrics, getters and controller `evaluator` needs (the checker process does
    this before it gives up its uid, so a name it cannot load fails before any code runs)."""
    controller_class()
    for func, result, exp, _ in _parts(evaluator):
        load("metrics", func)
        for getter in (result, exp):
            if getter is not None:
                _getter(getter)


def score(evaluator: Mapping, http: Http, cache: Path | None = None) -> float:
    """OSWorld's score of `evaluator` (one metric or a list joined by `conj`), its getters
    reading the environment through `http` and OSWorld's cache folder (`cache`, as the
    `postconfig` steps left it; else an empty one). Runs in the checker process, never the
    host."""
    with Relay(http) as relay, tempfile.TemporaryDirectory(prefix="envab-eval-") as empty:
        cache = str(cache or empty)
        env = types.SimpleNamespace(
            controller=controller_class()(vm_ip="127.0.0.1", server_port=relay.port),
            vm_ip="127.0.0.1",
            server_port=relay.port,
            chromium_port=debugging.DEBUGGING_PORT,  # the checker's relay (checker.run)
            vm_platform=PLATFORM,
            vlc_port=None,
            cache_dir=cache,
            http_server=f"http://127.0.0.1:{relay.port}",
        )
        scores = []
        for func, result, exp, opts in _parts(evaluator):
            metric = load("metrics", func)
            got = _getter(result)(env, result)
            if exp is None:
                value = metric(got, **(opts or {}))
            else:
                value = metric(got, _getter(exp)(env, exp), **(opts or {}))
            scores.append(float(value))
            if evaluator.get("conj", "and") == "and" and not value:
                return 0.0
    if evaluator.get("conj", "and") == "or":
        return max(scores)
    return sum(scores) / len(scores)


def check(evaluator: Mapping, state) -> float:
    """The host's checker for the X desktop: `state` is the environment's access (`http`,
    `postconfig`), not a snapshot of its state."""
    return evaluate(evaluator, state.http, state.postconfig, browser=state.browser)


check.reads_environment = True  # the host passes the environment itself (envs/host/pool.py)
check.partial_credit = True  # OSWorld's metrics may answer a fraction (envs/protocol.py: checked)
check.final_action = by_final_action  # the host applies it before any checker runs
