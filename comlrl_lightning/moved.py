"""Import paths that moved when the opt-in families got their own subpackages (in 0.2.0).

The old paths keep working until :data:`REMOVED_IN`: ``import comlrl_lightning.core.dpo`` (or
``from comlrl_lightning.sandbox.launch import …``, a YAML ``class_path``, an old checkpoint's pickled
config) gives the module at its new path, the same object, with one ``DeprecationWarning`` per old
path and process naming the new one. :func:`install` (called by the package's ``__init__``) puts
:class:`MovedFinder` first on ``sys.meta_path``; it answers only for the names in :data:`MOVED`.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType

REMOVED_IN = "0.3.0"
"""The release whose package no longer answers for the old paths."""

MOVED: dict[str, str] = {
    "comlrl_lightning.algorithms.madpo": "comlrl_lightning.preference.madpo",
    "comlrl_lightning.algorithms.madpo_iter": "comlrl_lightning.preference.madpo_iter",
    "comlrl_lightning.algorithms.marlhf": "comlrl_lightning.preference.marlhf",
    "comlrl_lightning.algorithms.marlhf_iter": "comlrl_lightning.preference.marlhf_iter",
    "comlrl_lightning.algorithms.joint_reward_model": "comlrl_lightning.preference.joint_reward_model",
    "comlrl_lightning.algorithms.reward_model_folder": "comlrl_lightning.preference.reward_model_folder",
    "comlrl_lightning.algorithms.round_loop": "comlrl_lightning.preference.round_loop",
    "comlrl_lightning.core.dpo": "comlrl_lightning.preference.dpo",
    "comlrl_lightning.core.pairs": "comlrl_lightning.preference.pairs",
    "comlrl_lightning.core.pair_batch": "comlrl_lightning.preference.pair_batch",
    "comlrl_lightning.core.preference": "comlrl_lightning.preference.selection",
    "comlrl_lightning.core.preference_config": "comlrl_lightning.preference.pair_source",
    "comlrl_lightning.core.replay": "comlrl_lightning.preference.replay",
    "comlrl_lightning.comparator": "comlrl_lightning.preference.comparator",
    "comlrl_lightning.sandbox": "comlrl_lightning.coding.sandbox",
    "comlrl_lightning.tasks.coding": "comlrl_lightning.coding",
}
"""Old module or package path -> its new path (a package's submodules follow it)."""


def new_path(name: str) -> str | None:
    """The current path of the module once imported as ``name``, or None if ``name`` did not move."""
    for old, new in MOVED.items():
        if name == old or name.startswith(old + "."):
            return new + name[len(old) :]
    return None


class _Alias(importlib.abc.Loader):
    """Loads an old name as the module at its new path (imported normally, under its own name)."""

    def __init__(self, old: str, new: str) -> None:
        self.old, self.new = old, new
        self._spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        _warn(f"{self.old} moved to {self.new}; the old path is removed in {REMOVED_IN}")
        module = importlib.import_module(self.new)
        self._spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # the import system stamped the alias's spec on the real module: give it back its own
        module.__spec__ = self._spec


class MovedFinder(importlib.abc.MetaPathFinder):
    """Finds the names of :data:`MOVED` (and their submodules); None for every other name."""

    def find_spec(self, fullname: str, path=None, target=None) -> importlib.machinery.ModuleSpec | None:
        new = new_path(fullname)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Alias(fullname, new))


def install() -> None:
    """Put one :class:`MovedFinder` first on ``sys.meta_path`` (a second call changes nothing)."""
    if not any(isinstance(f, MovedFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, MovedFinder())


def _warn(message: str) -> None:
    """A DeprecationWarning attributed to the code that imported the old path (the first frame outside
    the import machinery and this file), so Python's default filters show it where that code is
    ``__main__``, as for any deprecation."""
    frame, level = sys._getframe(1), 2
    while frame is not None:
        name = frame.f_code.co_filename
        if "importlib" in name and "_bootstrap" in name:  # not counted by warnings' stacklevel either
            frame = frame.f_back
            continue
        if name not in (__file__, importlib.__file__):
            break
        frame, level = frame.f_back, level + 1
    warnings.warn(message, DeprecationWarning, stacklevel=level)
