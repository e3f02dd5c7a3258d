"""The families' old import paths (``comlrl_lightning/moved.py``): each still imports, as the same
module object as its new path, with one DeprecationWarning naming the new path; nothing else is
answered by the finder. Run in fresh interpreters: the rest of the suite has imported the new paths."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from comlrl_lightning.moved import MOVED, new_path

ROOT = Path(__file__).resolve().parents[1] / "comlrl_lightning"

PROBE = r"""
import importlib, json, sys, warnings
import comlrl_lightning
out = {}
for old in sys.argv[1:]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
        again = importlib.import_module(old)
    out[old] = {
        "name": module.__name__, "spec": module.__spec__.name, "same": module is again,
        "is_new": module is sys.modules[module.__name__],
        "warnings": [(w.category.__name__, str(w.message), w.filename) for w in caught],
    }
print(json.dumps(out))
"""


def _probe(*names: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *names], capture_output=True, text=True, timeout=300, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_every_old_path_is_its_new_module_with_one_deprecation_line():
    olds = [*MOVED, "comlrl_lightning.sandbox.launch", "comlrl_lightning.comparator.config"]
    seen = _probe(*olds)
    for old in olds:
        got = seen[old]
        assert got["name"] == got["spec"] == new_path(old) and got["is_new"] and got["same"], (old, got)
        deprecations = [w for w in got["warnings"] if w[0] == "DeprecationWarning" and old in w[1]]
        assert len(deprecations) == 1, (old, got["warnings"])  # imported twice, warned once
        assert f"moved to {new_path(old)};" in deprecations[0][1]
        assert deprecations[0][2] == "<string>", "attributed to the importing code, not the import machinery"


def test_an_old_class_path_pickled_before_the_move_loads_as_the_new_class():
    """A checkpoint holds ``comlrl_lightning.core.dpo.DPOConfig`` by name: it loads as the new class."""
    code = (
        "import pickle, pickletools, comlrl_lightning\n"
        "from comlrl_lightning.preference.dpo import DPOConfig\n"
        "blob = pickle.dumps(DPOConfig(dpo_beta=0.25), protocol=2).replace(b'comlrl_lightning.preference.dpo',"
        " b'comlrl_lightning.core.dpo')\n"
        "assert b'comlrl_lightning.core.dpo' in blob\n"
        "got = pickle.loads(blob)\n"
        "print(type(got) is DPOConfig and got.dpo_beta == 0.25)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.stdout.strip() == "True", done.stderr[-2000:]


def test_the_table_names_moved_files_only():
    for old, new in MOVED.items():
        rel = old.removeprefix("comlrl_lightning.").split(".")
        assert not (ROOT.joinpath(*rel).with_suffix(".py").exists() or ROOT.joinpath(*rel).is_dir()), old
        rel = new.removeprefix("comlrl_lightning.").split(".")
        assert (
            ROOT.joinpath(*rel).with_suffix(".py").exists() or (ROOT.joinpath(*rel) / "__init__.py").exists()
        )
    assert new_path("comlrl_lightning.core.loss") is None and new_path("comlrl_lightning.core.dpo_x") is None
    assert new_path("comlrl_lightning.algorithms.madpo_iter") == "comlrl_lightning.preference.madpo_iter"
