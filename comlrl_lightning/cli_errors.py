"""One line for a config error: the field, the value, what is allowed, and "did you mean".

jsonargparse reports a bad key or value inside a union of every class a field may hold, with the
useful line indented a few levels deep and a dump of the given value after it. :func:`explain`
reads that report and returns one line that names the full key (``data.init_args.batch_size``),
says what was given and what is allowed, and, for a misspelt key or value, the closest allowed one;
``comlrl-lightning`` prints it last.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import inspect
import re
import typing
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


def init_keys(class_path: str) -> list[str]:
    """The keys a class accepts under ``init_args``: its (and its bases') ``__init__`` parameters,
    and ``<param>.<field>`` for a dataclass-typed parameter (empty if the class cannot be imported)."""
    try:
        module, _, name = class_path.rpartition(".")
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return []
    keys: list[str] = []
    for klass in inspect.getmro(cls) if inspect.isclass(cls) else []:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        try:
            hints = typing.get_type_hints(init)
        except Exception:  # noqa: BLE001 - a forward reference that does not resolve: names only
            hints = {}
        for p in inspect.signature(init).parameters.values():
            if p.name == "self" or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                continue
            keys.append(p.name)
            hint = hints.get(p.name)
            for arg in (hint, *typing.get_args(hint)):
                if dataclasses.is_dataclass(arg):
                    keys += [f"{p.name}.{f.name}" for f in dataclasses.fields(arg)]
    return keys


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
    path: list[tuple[int, str]] = []  # (indent, key part) of the enclosing keys
    class_path = ""
    for line in message.splitlines():
        indent, text = len(line) - len(line.lstrip()), line.strip()
        path = [(i, k) for i, k in path if i < indent]
        key = re.match(r'(?:- )?Parser key "([^"]+)":', text)
        if key:
            path.append((indent, key.group(1)))
            continue
        cls = re.match(r"- Problem with given class_path '([^']+)':", text)
        if cls:
            class_path = cls.group(1)
            path.append((indent, "init_args"))
            continue
        if not text or text.startswith(_STRUCTURE):
            continue
        where = ".".join(k for _, k in path)
        option = re.match(r"(?:Option|Key) '([^']+)' is not (?:accepted|expected)", text) or re.match(
            r"Subcommand '\w+' does not accept option '([^']+)'", text
        )
        if option:
            name = option.group(1)
            full = f"{where}.{name}" if where else name
            if not where and name.split(".")[0] in ("optimizer", "lr_scheduler"):
                return f"{full}: {_OPTIMIZER_HINT}"
            allowed = init_keys(class_path) if class_path else [o.lstrip("-") for o in options]
            return f"{full}: no such key{' of ' + class_path if class_path else ''}{suggest(name, allowed)}"
        literal = re.match(r"Expected a typing\.Literal\[(.*)\]\. Got value: (.*)", text)
        if literal:
            allowed = re.findall(r"'([^']*)'", literal.group(1))
            got = literal.group(2)
            return f"{where}: got {got!r}; allowed: {', '.join(map(repr, allowed))}{suggest(got, allowed)}"
        return f"{where}: {text}" if where else text
    return None


def parser_options(parser: Any) -> list[str]:
    """Every ``--option`` string of a jsonargparse/argparse parser."""
    return [
        s for action in getattr(parser, "_actions", []) for s in action.option_strings if s.startswith("--")
    ]
