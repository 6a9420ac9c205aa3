"""Every exception class of the project is either a refusal (bad input or a missing
prerequisite: one line, exit 2; envab/errors.py) or a runtime failure listed here with its reason,
so a new class must choose. Read from the source, so nothing heavy is imported."""

from __future__ import annotations

import ast
import builtins
from pathlib import Path

from envab.errors import Refusal, refused

REPO = Path(__file__).resolve().parent.parent
STAGES = ("envab", "envs", "trainer", "eval", "analysis")

# Failures of a running system, not of its input: each reported where it happens (a gate, an HTTP
# status, an invalid episode), never as an entry point's refusal. A class derived from one of
# these is one too.
RUNTIME = {
    "ActionRejected": "the desktop refused one action mid-episode; nothing changed",
    "AgentError": "the guest's desktop agent answered a call with an error",
    "AnswerTooLarge": "the environment answered a browser turn past its chunk: the checker's "
    "evaluation is invalid (CheckerFailed 'oversize')",
    "AgentTimeout": "the guest's desktop agent did not answer in time",
    "BadRequest": "one HTTP request to the host is wrong: answered 400, the host runs on",
    "BuildError": "a guest build step failed while building",
    "ChannelClosed": "a worker's channel closed: its environment fails a gate",
    "ChannelTimeout": "a worker did not answer in time: its environment fails a gate",
    "CheckerError": "a checker could not run: the verifier-available gate fails",
    "CheckerFailed": "the checker process gave no valid score (timeout, crash, garbage, ...): "
    "the verifier-available gate fails, with the failure named",
    "CheckpointWriteError": "a checkpoint could not be written (a full disk); the run resumes",
    "ConfinementError": "the kernel refused a step of the checker's confinement: it does not "
    "score (CheckerFailed 'sandbox')",
    "DrumsError": "a host's answer to one request mid-run; open_arm reports a refused start "
    "as ArmError",
    "FaultsDisabled": "a fault switch sent to a host started without them: answered 403",
    "FilterError": "libseccomp or the kernel refused a seccomp filter: raised as the sandbox's or "
    "the checker's ConfinementError, which stops it before it serves or scores",
    "FileNotFrozen": "a file a task downloads is not in the host's frozen store (or has other "
    "bytes): the set-up gate fails, or the checker gets no file",
    "ForkUnsupported": "a backend that cannot fork: the caller creates sessions instead",
    "GateFailed": "a QEMU environment failed a gate: its episode is invalid",
    "NonConformance": "a backend broke the session protocol: a conformance test's failure",
    "PrivateAddress": "a fetch's name resolved to a private address when connecting (DNS "
    "rebinding): reported as the URL's file:private_host",
    "Quarantined": "an environment that failed a gate is asked to fork: answered 409",
    "SetupError": "a set-up step cannot run in the guest: the set-up gate fails",
    "Unavailable": "the X desktop cannot serve an evaluator's getter or metric: a gate fails",
    "UnknownEnvironment": "no environment with that id: answered 404",
    "TurnMismatch": "TRL asked for a tool call other than the ones run for its turn: its loop "
    "changed under the concurrent tool calls, and the run stops",
    "UnsampleableToken": "a turn held a token no turn may contain: its episode is invalid",
    "VMDied": "a QEMU VM died: its environment fails a gate",
    "Unfetchable": "one URL the freeze's fetch cannot store, reported as its task's reason "
    "(file:missing, ...) or refused by the tasks job; the mirror maker lists it and goes on",
    "_Unreachable": "internal to the Drums client: the host did not answer; carries the gate",
}

BUILTIN_EXCEPTIONS = {
    name
    for name in dir(builtins)
    if isinstance(getattr(builtins, name), type)
    and issubclass(getattr(builtins, name), BaseException)
}


def project_classes() -> dict[str, list[tuple[str, list[str]]]]:
    """Class name -> (where, its bases' names) for every class of the project's stages."""
    found: dict[str, list[tuple[str, list[str]]]] = {}
    for stage in STAGES:
        for path in sorted((REPO / stage).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.ClassDef):
                    bases = [
                        b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "")
                        for b in node.bases
                    ]
                    where = f"{path.relative_to(REPO)}:{node.lineno}"
                    found.setdefault(node.name, []).append((where, bases))
    return found


def derives(name: str, wanted: set[str], classes: dict, seen: frozenset = frozenset()) -> bool:
    """Whether class `name` derives (by name, through the project's classes) from any of
    `wanted`."""
    if name in wanted:
        return True
    return any(
        derives(base, wanted, classes, seen | {name})
        for _, bases in classes.get(name, [])
        for base in bases
        if base not in seen
    )


CLASSES = project_classes()
EXCEPTIONS = sorted(n for n in CLASSES if derives(n, BUILTIN_EXCEPTIONS | {"Refusal"}, CLASSES))


def test_every_exception_class_is_a_refusal_or_a_listed_runtime_failure():
    undecided = [
        f"{where} {name}"
        for name in EXCEPTIONS
        if not derives(name, {"Refusal", *RUNTIME}, CLASSES)
        for where, _ in CLASSES[name]
    ]
    assert not undecided, (
        "each exception class is a Refusal (bad input, one line, exit 2: envab/errors.py) or a "
        "runtime failure in RUNTIME with its reason:\n" + "\n".join(undecided)
    )


def test_a_runtime_failure_is_not_also_a_refusal():
    both = [
        n
        for n in EXCEPTIONS
        if derives(n, set(RUNTIME), CLASSES) and derives(n, {"Refusal"}, CLASSES)
    ]
    assert not both, f"runtime failures that derive from Refusal too: {both}"


def test_the_scan_finds_the_refusals_and_the_runtime_failures():
    refusals = {n for n in EXCEPTIONS if derives(n, {"Refusal"}, CLASSES)}
    assert {"ConfigError", "ArmError", "GuardError", "ModelPinError", "TaskSourceError"} <= refusals
    assert {"VMDied", "ChannelClosed", "GateFailed", "Quarantined"} <= set(EXCEPTIONS) - refusals


def test_a_refusal_keeps_its_builtin_base():
    from envab.envs.arm_schema import ArmError
    from envab.envs.auth import TokenError
    from envab.schema import ConfigError
    from envab.trainer.manifest import ModelPinError

    for cls, builtin in (
        (ConfigError, ValueError),
        (ArmError, ValueError),
        (TokenError, RuntimeError),
        (ModelPinError, Exception),
    ):
        assert issubclass(cls, Refusal) and issubclass(cls, builtin), cls


def test_an_entry_point_reports_a_refusal_in_one_line(capsys):
    said = []

    class Console:
        def say(self, text):
            said.append(text)

    assert refused(Refusal("config.yaml: arms: unknown key"), Console()) == 2
    assert capsys.readouterr().err == "error: config.yaml: arms: unknown key\n"
    assert said == ["error: config.yaml: arms: unknown key"]
    assert refused(Refusal("qemu-img not found"), prefix="envab.envs.qemu", code=1) == 1
    assert capsys.readouterr().err == "envab.envs.qemu: qemu-img not found\n"
