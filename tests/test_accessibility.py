"""The accessibility tree reaches the confined checker as the environment writes it and nothing it
says reaches further: desktop-env's own tree getter and metric, in a real checker process, read a
tree a stand-in environment answers on `/accessibility`, hostile ones included (an external
entity, an entity bomb, a tree that is no XML). The real tree, AT-SPI walked by the
in-environment server in the full image, scoring a task by its oracle, is
tests/test_xdesktop_full.py's (`xdf-chrome-switch-tab`)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ElementTree

import pytest

from envab.envs.xdesktop import apps, checker, evaluate, server
from envab.envs.xdesktop.checker import CheckerFailed
from envab.envs.xdesktop.confine import Limits
from tests.test_checker_sandbox import Environment, _why_not

NS = f' xmlns:st="{server.TREE_NS["st"]}"'  # as the in-environment server writes the tree
# desktop-env's address-bar getter and a metric of OSWorld's Chrome tasks over what it reads
ADDRESS = {
    "func": "is_expected_url_pattern_match",
    "result": {"type": "active_url_from_accessTree", "goto_prefix": "https://"},
    "expected": {"type": "rule", "rules": {"expected": ["^https://example\\.org/recipes$"]}},
}


def _tree(address: str, doctype: str = "") -> str:
    return (
        f'{doctype}<desktop-frame{NS}><application name="Google Chrome"><frame name="Recipes">'
        f'<entry name="Address and search bar" st:focused="true">{address}</entry>'
        "</frame></application></desktop-frame>"
    )


class TreeEnvironment(Environment):
    """A stand-in environment answering `/accessibility` with `tree` (OSWorld's JSON, `AT`)."""

    def __init__(self, tree: str, status: int = 200):
        super().__init__({})
        self.tree, self.status = tree, status

    def http(self, method, path, content_type, body):
        if path == "/accessibility":
            self.requests.append((method, path, body))
            return {"status": self.status, "content_type": "application/json",
                    "body": json.dumps({"AT": self.tree}).encode()}  # fmt: skip
        return super().http(method, path, content_type, body)


def _score(tree: str, evaluator=ADDRESS, limits: Limits | None = None, status=200) -> float:
    env = TreeEnvironment(tree, status)
    try:
        return checker.run(evaluator, env.http, evaluate.ROUTES, limits)
    finally:
        assert [r[1] for r in env.requests] == ["/accessibility"]  # asked once, nothing else


needs_checker = pytest.mark.skipif(_why_not() is not None, reason=str(_why_not()))


@needs_checker
def test_the_address_bar_in_the_tree_scores_the_task_and_another_address_does_not():
    assert _score(_tree("example.org/recipes")) == 1.0
    assert _score(_tree("example.org/shopping")) == 0.0


@needs_checker
@pytest.mark.parametrize("status", [501, 400, 500])
def test_a_tree_the_desktop_does_not_give_is_no_score_not_a_0(status):
    # desktop-env's getter would read it as no address bar, and its metric score that 0
    with pytest.raises(CheckerFailed, match="/accessibility") as failed:
        _score(_tree("example.org/recipes"), status=status)
    assert failed.value.failure == "environment"


@needs_checker
def test_an_external_entity_in_the_tree_is_not_read_by_the_checker(tmp_path):
    # Were the entity resolved, the address would be the file's text and the task would score 1;
    # the getter's parser leaves it undefined, and the checker names the error instead.
    secret = tmp_path / "address"
    secret.write_text("example.org/recipes")
    secret.chmod(0o644)
    tmp_path.chmod(0o755)
    doctype = f'<!DOCTYPE desktop-frame [<!ENTITY address SYSTEM "file://{secret}">]>'
    with pytest.raises(CheckerFailed, match="XMLSyntaxError") as failed:
        _score(_tree("&address;", doctype))
    assert failed.value.failure == "crash"


@needs_checker
def test_an_entity_bomb_or_a_tree_that_is_no_xml_is_a_named_failure_not_a_score():
    laughs = "".join(f'<!ENTITY l{i} "{f"&l{i - 1};" * 10 if i else "ha"}">' for i in range(10))
    bomb = _tree("&l9;", f"<!DOCTYPE desktop-frame [{laughs}]>")
    for tree in (bomb, "<desktop-frame><application", "not a tree"):
        with pytest.raises(CheckerFailed) as failed:
            _score(tree, limits=Limits(deadline_s=30))
        assert failed.value.failure == "crash", (tree[:40], failed.value)


@needs_checker
def test_the_tree_metric_selects_with_the_namespaces_the_server_writes():
    tree = _tree("example.org/recipes")
    rule = {"selectors": ["entry[st|focused=true]"], "text": "example.org/recipes", "exact": True}
    evaluator = {"func": "check_accessibility_tree", "result": {"type": "accessibility_tree"},
                 "expected": {"type": "rule", "rules": [rule]}}  # fmt: skip
    assert _score(tree, {**evaluator, "options": {}}) == 1.0


def test_the_servers_namespaces_are_those_desktop_envs_metrics_select_with():
    metric = evaluate.load("metrics", "check_accessibility_tree")
    assert metric.__globals__["_accessibility_ns_map"]["ubuntu"] == server.TREE_NS


def test_what_an_application_names_that_xml_cannot_carry_is_left_out_not_a_broken_tree():
    text = server._xml_text("line\x00one\x07\x1b[0m\ufffe two\ttab")
    assert text == "lineone[0m two\ttab"
    assert not server._XML_NAME("a b") and not server._XML_NAME("1st")
    assert server._XML_NAME("text-model") and server._XML_NAME("xml-roles")
    element = ElementTree.Element("entry", {"name": text})
    ElementTree.fromstring(ElementTree.tostring(element))  # well-formed


def test_a_desktop_whose_image_carries_no_tree_answers_501_and_the_freeze_says_so():
    # no AT-SPI bus (the base image, or a display not started): refused before AT-SPI is asked,
    # which would abort the server with no bus to join
    for display in (None, server.Display()):
        assert server.Routes(display).handle("GET", "/accessibility", "", b"")[0] == 501
    task = {"id": "t", "config": [], "related_apps": ["chrome"],
            "evaluator": {**ADDRESS, "result": {"type": "active_tab_info"}}}  # fmt: skip
    why = "result getter 'active_tab_info' reads the accessibility tree, which the base image"
    assert ("getter:active_tab_info", f"{why} does not carry") in evaluate.blockers(task, "base")
    assert not [g for g, _ in evaluate.blockers(task, "full") if g.startswith("getter:")]
    assert {"full"} == apps.TREE_IMAGES
    assert evaluate.asks_browser(task["evaluator"])  # the tab it names is opened over the port
    assert not evaluate.asks_browser(ADDRESS)
