"""One line for a config error: the field, the value, what is allowed, and "did you mean".

jsonargparse reports a bad key or value inside a union of every class a field may hold, with the
useful line indented a few levels deep and a dump of the given value after it. :func:`explain`
reads that report and returns one line that names the full key (``data.init_args.batch_size``),
says what was given and what is allowed, and, for a misspelt key or value, the closest allowed one;
``comlrl-lightning`` prints it last.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import re
from collections.abc import Iterable
from typing import Any

_OPTIMIZER_HINT = (
    "a top-level optimizer/lr_scheduler would replace the per-agent ones: give the factory as "
    "model.init_args.optimizer (and model.init_args.scheduler), e.g. --model.init_args.optimizer=torch.optim.SGD "
    "--model.init_args.optimizer.lr=0.01"
)
_REWARD_HINT = (
    "a reward is called as fn(joint_actions, episodes, turn) (comlrl_lightning.envs.rewards.RewardFunction); "
    "a TRL-style reward fn(prompts, completions, **kwargs) -> list[float] goes in "
    "{class_path: comlrl_lightning.envs.TRLReward, init_args: {function: <its import path>}}"
)
_STRUCTURE = (
    "Does not validate against",
    "Subtypes:",
    "Errors:",
    "Given value",
    "- Expected a <class 'NoneType'>",
)


def suggest(name: str, candidates: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` for the closest candidate, or ``""`` when none is close."""
    close = difflib.get_close_matches(name, sorted(set(candidates)), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


_KEY_HINTS = {
    "log_completions": "completions are logged by a callback: trainer.callbacks lists "
    "comlrl_lightning.callbacks.CompletionLogger",
}
"""Unknown keys users carry over from other libraries (CoMLRL, TRL), with where the setting lives here."""


def _class(class_path: str) -> Any:
    """The class at ``class_path``, or None when it cannot be imported."""
    try:
        module, _, name = class_path.rpartition(".")
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return None


def accepted_keys(class_path: str) -> list[str]:
    """The keys a class accepts under ``init_args``, as jsonargparse reads its signature (nested
    groups too: ``rollout.num_generations``); empty if the class cannot be imported."""
    from jsonargparse import ArgumentParser

    cls = _class(class_path)
    try:
        parser = ArgumentParser(exit_on_error=False)
        parser.add_class_arguments(cls, fail_untyped=False)
    except Exception:  # noqa: BLE001 - only for the message: no suggestion then
        return []
    return [a.dest for a in parser._actions if a.dest != "help" and not a.dest.endswith(".help")]


def unknown_key(full: str, name: str, allowed: list[str], owner: str) -> str:
    """``"<full>: no such key of <owner>"`` and the closest *allowed* key, compared part by part:
    a dotted ``name`` within its group (``rollout.num_generation`` -> ``rollout.num_generations``,
    or the closest group when its group does not exist), a plain one against the top-level keys and
    the last part of the nested ones (``num_generations`` -> ``rollout.num_generations``). The
    rejected key itself is never suggested."""
    allowed = [k for k in allowed if k != name]
    groups = sorted({k.split(".")[0] for k in allowed if "." in k})
    of = f" of {owner}" if owner else ""
    head, _, leaf = name.rpartition(".")
    if head and head not in groups:
        close = difflib.get_close_matches(head, groups, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else f"; its groups: {groups}" if groups else ""
        return f"{full}: no such key{of} (no group {head!r}){hint}"
    by_part = {k.rpartition(".")[2]: k for k in allowed if k.startswith(f"{head}.")} if head else {}
    if not head:
        by_part = {k.rpartition(".")[2]: k for k in allowed if "." in k}
        by_part.update({k: k for k in allowed if "." not in k})  # a top-level key wins a tie
    hints = {**_KEY_HINTS, **getattr(_class(owner), "unknown_key_hints", {})}
    if name in hints:
        return f"{full}: no such key{of}; {hints[name]}"
    close = difflib.get_close_matches(leaf, sorted(by_part), n=1, cutoff=0.6)
    hint = f"; did you mean {by_part[close[0]]!r}?" if close else ""
    return f"{full}: no such key{of}{hint}"


def _signature(path: str) -> str:
    try:
        module, _, name = path.rpartition(".")
        return str(inspect.signature(getattr(importlib.import_module(module), name)))
    except Exception:  # noqa: BLE001 - only for the message
        return ""


def explain(message: str, options: Iterable[str] = ()) -> str | None:
    """One line for jsonargparse's error ``message`` (None when the report has no line it knows).

    Args:
        message: the text of jsonargparse's ``ArgumentError``.
        options: the parser's command-line options (``--trainer.max_steps``, ...), for "did you mean".
    """
    unrecognized = re.match(r"unrecognized arguments: (\S+)", message)
    if unrecognized:
        flag = unrecognized.group(1).split("=")[0]
        if flag.lstrip("-").split(".")[0] in ("optimizer", "lr_scheduler"):
            return f"{flag}: {_OPTIMIZER_HINT}"
        return f"{flag}: not an option{suggest(flag, options)} (comlrl-lightning fit --help lists them)"
    protocol = message.find("does not implement protocol RewardFunction")
    if protocol >= 0:
        keys = re.findall(r'Parser key "([^"]+)":', message[:protocol])
        given = re.search(r"Given value: (\S+)", message[protocol:])
        value = given.group(1) if given else "the given value"
        where = ".init_args.".join(keys) if keys else "reward"
        return f"{where}: {value}{_signature(value)} cannot be a reward: {_REWARD_HINT}"
    lines = message.splitlines()
    path: list[tuple[int, str, int]] = []  # (indent, key part, line) of the enclosing keys
    class_path = ""
    for at, line in enumerate(lines):
        indent, text = len(line) - len(line.lstrip()), line.strip()
        path = [p for p in path if p[0] < indent]
        key = re.match(r'(?:- )?Parser key "([^"]+)":', text)
        if key:
            path.append((indent, key.group(1), at))
            continue
        cls = re.match(r"- Problem with given class_path '([^']+)':", text)
        if cls:
            class_path = cls.group(1)
            path.append((indent, "init_args", at))
            continue
        if not text or text.startswith(_STRUCTURE):
            continue
        where = ".".join(k for _, k, _ in path)
        unknown = (
            re.match(r"(?:Option|Key) '([^']+)' is not (?:accepted|expected)", text)
            or re.match(r"Subcommand '\w+' does not accept option '([^']+)'", text)
            or re.match(r"Group '([^']+)' does not accept option '([^']+)'", text)
            or re.match(r"(?:unrecognized arguments|ambiguous option): --([^=\s]+)", text)
        )
        if unknown:
            name = ".".join(unknown.groups())
            full = f"{where}.{name}" if where else name
            if not where and name.split(".")[0] in ("optimizer", "lr_scheduler"):
                return f"{full}: {_OPTIMIZER_HINT}"
            allowed = accepted_keys(class_path) if class_path else [o.lstrip("-") for o in options]
            return unknown_key(full, name, allowed, class_path)
        literal = re.match(r"Expected a typing\.Literal\[(.*)\]\. Got value: (.*)", text)
        if literal:
            allowed = re.findall(r"'([^']*)'", literal.group(1))
            got = literal.group(2)
            return f"{where}: got {got!r}; allowed: {', '.join(map(repr, allowed))}{suggest(got, allowed)}"
        expected = re.match(r"(?:- )?Expected a <class '([^']+)'>(?:\. Got value: (.*))?", text)
        if expected and path:
            return f"{where}: got {_given(lines, path[-1], expected.group(2))}; allowed: {_allowed(lines, path[-1], expected.group(1))}"
        return f"{where}: {text}" if where else text
    return None


def _given(lines: list[str], key: tuple[int, str, int], inline: str | None) -> str:
    """The value given for ``key``: jsonargparse's ``Got value``, else its ``Given value`` line."""
    if inline is not None:
        return repr(inline)
    indent, _, start = key
    for line in lines[start + 1 :]:
        if len(line) - len(line.lstrip()) <= indent:
            break
        if line.strip().startswith("Given value: ") and len(line) - len(line.lstrip()) == indent + 2:
            return repr(line.strip()[len("Given value: ") :])
    return "an invalid value"


def _allowed(lines: list[str], key: tuple[int, str, int], first: str) -> str:
    """The types ``key`` accepts, in words: its union's ``Subtypes`` (``int or null``), else ``first``."""
    indent, _, start = key
    names = [first]
    for line in lines[start + 1 :]:
        if len(line) - len(line.lstrip()) <= indent:
            break
        if line.strip().startswith("Subtypes: ") and len(line) - len(line.lstrip()) == indent + 2:
            names = re.findall(r"<class '([^']+)'>", line) or names
            break
    words = {
        "NoneType": "null",
        "bool": "true or false",
        "str": "a string",
        "int": "an integer",
        "float": "a number",
    }
    return " or ".join(words.get(n, n) for n in names)


def parser_options(parser: Any) -> list[str]:
    """Every ``--option`` string of a jsonargparse/argparse parser."""
    return [
        s for action in getattr(parser, "_actions", []) for s in action.option_strings if s.startswith("--")
    ]


_FIELD_FIRST = re.compile(r"^(\w+(\.\w+|\[\d+\])+[ :]|\w+( \([^)]*\))?: )")
"""A message that opens with the field it is about (``num_generations: ...``, ``data.dataset: ...``,
``agents[0] (x): ...``, ``data.formatters[0] (...) fails ...``): the form every bad-input error of
this project takes (see the design's reliability principles)."""


def config_error(err: BaseException) -> str | None:
    """``"<Type>: <message>"`` when ``err`` is a bad-input error (a ValueError, TypeError or OSError
    whose message opens with the field it names), which ``comlrl-lightning`` prints alone, without a
    traceback above it; None for any other error (a bug: its traceback is what helps)."""
    text = str(err)
    if not (isinstance(err, (ValueError, TypeError, OSError)) and _FIELD_FIRST.match(text)):
        return None
    group = _instantiated_group(err)
    if group and not text.startswith(f"{group}."):  # a config group's own check names its bare field
        text = f"{group}.{text}"
    return f"{type(err).__name__}: {text}"


def _instantiated_group(err: BaseException) -> str | None:
    """The config group (``rollout``) jsonargparse was building when ``err`` was raised, if any."""
    tb = err.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code.co_name == "group_instantiate_class" and "group" in frame.f_locals:
            return getattr(frame.f_locals["group"], "dest", None)
        tb = tb.tb_next
    return None
