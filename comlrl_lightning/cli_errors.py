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

from comlrl_lightning.infra.run_lock import RunFolderBusy

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
    "peft_config": "a LoRA adapter is set per agent: model.init_args.agents[i].adapter takes a peft.LoraConfig's "
    "fields, e.g. {model: gpt2, adapter: {r: 8, lora_alpha: 16, target_modules: [c_attn]}}",
    "use_vllm": "vLLM is chosen as a generation backend: model.init_args.sampling.generation_backend: "
    "vllm (a colocated engine; the vllm extra, `make setup-vllm`; see docs/generation.md)",
    "report_to": "logging is Lightning's: trainer.logger (TensorBoard by default; e.g. "
    "{class_path: lightning.pytorch.loggers.WandbLogger})",
    "per_device_train_batch_size": "prompts per batch are data.init_args.batch_size (TRL's counts "
    "completions: prompts x num_generations)",
    "gradient_accumulation_steps": "for memory, model.init_args.loss.micro_batch_size runs a batch's "
    "backward in slices (the same gradients)",
    "bf16": "the dtype is set per agent: model.init_args.agents[i].dtype: bfloat16",
    "gradient_checkpointing": "a callback: trainer.callbacks lists comlrl_lightning.callbacks.GradientCheckpointing",
    "reward_funcs": "the reward is data.init_args.reward (several: comlrl_lightning.WeightedReward; a "
    "TRL-style fn(prompts, completions, **kwargs) through comlrl_lightning.envs.TRLReward)",
    "reward_weights": "data.init_args.reward: {class_path: comlrl_lightning.WeightedReward, init_args: "
    "{functions: [...], weights: [...]}}",
    "max_steps": "trainer.max_steps (it counts every agent's optimizer step: agents x batches)",
    "num_train_epochs": "trainer.max_epochs",
    "logging_steps": "trainer.log_every_n_steps",
    "save_steps": "checkpoints every n steps: a ModelCheckpoint in trainer.callbacks with every_n_train_steps",
    "output_dir": "trainer.default_root_dir",
    "seed": "the run's seed is seed_everything (top level)",
}
"""Unknown keys users carry over from other libraries (CoMLRL, TRL), with where the setting lives here;
keyed by the unknown key's first part (``peft_config.r`` is ``peft_config``'s)."""


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
    hints = {**_KEY_HINTS, **getattr(_class(owner), "unknown_key_hints", {})}
    first = name.split(".")[0]
    if first in hints:  # the key itself, not its sub-keys (peft_config, not peft_config.r)
        return f"{full[: len(full) - len(name)]}{first}: no such key{of}; {hints[first]}"
    head, _, leaf = name.rpartition(".")
    if head and head not in groups:
        close = difflib.get_close_matches(head, groups, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else f"; its groups: {groups}" if groups else ""
        return f"{full}: no such key{of} (no group {head!r}){hint}"
    by_part = {k.rpartition(".")[2]: k for k in allowed if k.startswith(f"{head}.")} if head else {}
    if not head:
        by_part = {k.rpartition(".")[2]: k for k in allowed if "." in k}
        by_part.update({k: k for k in allowed if "." not in k})  # a top-level key wins a tie
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
        literal = re.match(r"(?:- )?Expected a typing\.Literal\[(.*?)\](?:\. Got value: (.*))?$", text)
        if literal and (literal.group(2) is not None or path):
            allowed = re.findall(r"'([^']*)'", literal.group(1))
            got = literal.group(2)
            if got is None:  # inside a union (Literal | bool | None): the value is the key's "Given value"
                got = _given(lines, path[-1], None)
                got = got[1:-1] if got.startswith("'") else got
            others = [n for n in _subtypes(lines, path[-1]) if n] if literal.group(2) is None else []
            words = ", ".join([*map(repr, allowed), *(_WORDS.get(n, n) for n in others)])
            return f"{where}: got {got!r}; allowed: {words}{suggest(got, allowed)}"
        expected = re.match(r"(?:- )?Expected a <class '([^']+)'>(?:\. Got value: (.*))?", text)
        if expected and path:
            given = _given(lines, path[-1], expected.group(2))
            nested = re.search(r"NestedArg\(key='([^']+)', val='([^']*)'\)", given)
            if nested:  # --trainer.strategy=fsdp2 --trainer.strategy.mixed_precision=fp16
                cls = "comlrl_lightning.ShardedTeamStrategy" if where == "trainer.strategy" else "<its class>"
                return (
                    f"{where}.{nested.group(1)}: got {nested.group(2)!r}, but {where} is given by name: options "
                    f"need its class, e.g. --{where}={cls} --{where}.{nested.group(1)}={nested.group(2)} "
                    "(or class_path and init_args in YAML)"
                )
            return f"{where}: got {given}; allowed: {_allowed(lines, path[-1], expected.group(1))}"
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


_WORDS = {
    "NoneType": "null",
    "bool": "true or false",
    "str": "a string",
    "int": "an integer",
    "float": "a number",
}


def _subtypes(lines: list[str], key: tuple[int, str, int]) -> list[str]:
    """The class names of ``key``'s union ``Subtypes`` line (``["bool", "NoneType"]``; a
    ``typing.Literal`` is left out), empty when it has none."""
    indent, _, start = key
    for line in lines[start + 1 :]:
        if len(line) - len(line.lstrip()) <= indent:
            break
        if line.strip().startswith("Subtypes: ") and len(line) - len(line.lstrip()) == indent + 2:
            return re.findall(r"<class '([^']+)'>", line)
    return []


def _allowed(lines: list[str], key: tuple[int, str, int], first: str) -> str:
    """The types ``key`` accepts, in words: its union's ``Subtypes`` (``int or null``), else ``first``."""
    names = _subtypes(lines, key) or [first]
    return " or ".join(_WORDS.get(n, n) for n in names)


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
    """``"<Type>: <message>"`` when ``err`` is a refusal (a ValueError, TypeError or OSError whose
    message opens with the field it names, or a
    :class:`~comlrl_lightning.infra.run_lock.RunFolderBusy`), which ``comlrl-lightning`` prints alone, without a traceback above it; None for any other
    error (a bug: its traceback is what helps)."""
    text = str(err)
    bad_input = isinstance(err, (ValueError, TypeError, OSError)) and _FIELD_FIRST.match(text)
    if not (bad_input or isinstance(err, RunFolderBusy)):
        return None
    group = _instantiated_group(err)
    if group and not text.startswith(f"{group}."):  # a config group's own check names its bare field
        text = f"{group}.{text}"
    return f"{type(err).__name__}: {text}"


def wrapped_error(err: BaseException) -> str | None:
    """``"error: <message>"`` for a bad-input error jsonargparse lists inside a union error of ``err``
    or its causes (a strategy's or logger's own check, e.g. ``ShardedTeamStrategy.mixed_precision: got
    'fp16', ...``, behind ``Expected a <class 'str'>``); None when there is none."""
    while err is not None:
        for line in str(err).splitlines():
            text = line.strip()[2:] if line.strip().startswith("- ") else ""
            if _FIELD_FIRST.match(text) and not text.startswith(("Expected a", "Problem with")):
                return f"error: {text}"
        err = err.__cause__
    return None


def _instantiated_group(err: BaseException) -> str | None:
    """The config group (``rollout``) jsonargparse was building when ``err`` was raised, if any."""
    tb = err.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code.co_name == "group_instantiate_class" and "group" in frame.f_locals:
            return getattr(frame.f_locals["group"], "dest", None)
        tb = tb.tb_next
    return None
