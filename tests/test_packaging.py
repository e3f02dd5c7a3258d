"""Every package of the library is in pyproject's explicit package list (a wheel or a non-editable
install ships only the listed ones: ``comlrl_lightning.coordinator`` was missing, so ``pip install .``
could not import the coordinator)."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_folder_is_listed_in_pyproject():
    # the two tables by regex (tomllib is 3.11+, the library supports 3.10): packages = [...] and package-dir
    text = (ROOT / "pyproject.toml").read_text()
    listed = set(ast.literal_eval(re.search(r"^packages = (\[.*?\])", text, re.S | re.M)[1]))
    table = re.search(r"^\[tool\.setuptools\.package-dir\]\n(.*?)(?:\n\[|\Z)", text, re.S | re.M)[1]
    dirs = dict(re.findall(r'^"([^"]+)" = "([^"]+)"', table, re.M))
    found = set()
    for init in (ROOT / "comlrl_lightning").rglob("__init__.py"):
        rel = init.parent.relative_to(ROOT)
        found.add(".".join(rel.parts))
    for name, folder in dirs.items():
        assert (ROOT / folder / "__init__.py").exists(), (
            f"package-dir {name!r} -> {folder!r} has no __init__.py"
        )
        found.add(name)
    assert found - listed == set(), f"packages missing from pyproject.toml: {sorted(found - listed)}"
    assert listed - found == set(), (
        f"pyproject.toml lists packages that do not exist: {sorted(listed - found)}"
    )
