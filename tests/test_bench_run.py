"""benchmarks/run.py writes a section's numbers before its plot (a plot that fails loses nothing)."""

import json
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture
def run_module(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import run

    return run


def test_a_failing_plot_keeps_the_sections_numbers_and_fails_the_run(
    run_module, monkeypatch, tmp_path, capsys
):
    monkeypatch.setattr(run_module, "PARTIAL", str(tmp_path / "partial.json"))
    monkeypatch.setitem(run_module.RUNNERS, "vs_comlrl", lambda quick, base=None: {"ours_s_per100": 1.25})

    def no_matplotlib(res):
        raise ModuleNotFoundError("No module named 'matplotlib'")

    monkeypatch.setitem(run_module.PLOTS, "vs_comlrl", no_matplotlib)
    monkeypatch.setattr(run_module, "render", lambda res: "table")
    assert run_module.main(["--only", "vs_comlrl", "--results", str(tmp_path / "RESULTS.md")]) == 1
    assert json.loads((tmp_path / "partial.json").read_text())["vs_comlrl"]["ours_s_per100"] == 1.25
    assert "vs_comlrl: the plot failed (ModuleNotFoundError" in capsys.readouterr().err


def test_matplotlib_is_declared_for_make_bench():
    names = [
        line.split("#")[0].split("=")[0].strip()
        for line in (BENCH / "requirements.txt").read_text().splitlines()
    ]
    assert "matplotlib" in names
    assert "import matplotlib" in (BENCH / "credit.py").read_text()  # the script that needs it
