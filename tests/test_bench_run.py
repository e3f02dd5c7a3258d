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
    args = ["--only", "vs_comlrl", "--write", "--results", str(tmp_path / "RESULTS.md")]
    assert run_module.main(args) == 1
    assert json.loads((tmp_path / "partial.json").read_text())["vs_comlrl"]["ours_s_per100"] == 1.25
    assert "vs_comlrl: the plot failed (ModuleNotFoundError" in capsys.readouterr().err


def test_a_pass_that_writes_no_numbers_draws_no_plot(run_module, monkeypatch, tmp_path):
    """A ``--quick`` pass (or ``--only`` without ``--write``) once redrew vs_comlrl_reward.png from
    numbers RESULTS.md never recorded."""
    monkeypatch.setattr(run_module, "PARTIAL", str(tmp_path / "partial.json"))
    monkeypatch.setitem(run_module.RUNNERS, "vs_comlrl", lambda quick, base=None: {"ours_s_per100": 1.25})
    drawn = []
    monkeypatch.setitem(run_module.PLOTS, "vs_comlrl", drawn.append)
    monkeypatch.setattr(run_module, "render", lambda res: "table")
    for args in (["--quick", "--only", "vs_comlrl"], ["--only", "vs_comlrl"]):
        assert run_module.main([*args, "--results", str(tmp_path / "RESULTS.md")]) == 0
    assert drawn == [] and not (tmp_path / "RESULTS.md").exists()


def test_matplotlib_is_declared_for_make_bench():
    names = [
        line.split("#")[0].split("=")[0].strip()
        for line in (BENCH / "requirements.txt").read_text().splitlines()
    ]
    assert "matplotlib" in names
    assert "import matplotlib" in (BENCH / "learning" / "credit.py").read_text()  # the script that needs it


def test_one_section_rewritten_alone_keeps_the_recorded_machine_and_names_its_own(
    run_module, monkeypatch, tmp_path
):
    full = {"cores": 2, "cpu": "x", "torch_threads": 2, "python": "3.11",
            "versions": {"torch": "2.13.0", "trl": "1.16.0"}, "loadavg_start": [1, 1, 1]}  # fmt: skip
    here = {**full, "torch_threads": 1, "versions": {"torch": "2.13.0", "trl": "not installed"}}
    ran = {"date": "d", "wall_s": 60.0, "loadavg_start": [1, 1, 1], "loadavg_end": [1, 1, 1]}
    recorded = {"machine": full, "vs_trl": {"ran": ran, "ratio": 1.0}}
    (tmp_path / "results.json").write_text(json.dumps(recorded))
    monkeypatch.setattr(run_module, "PARTIAL", str(tmp_path / "partial.json"))
    monkeypatch.setattr(run_module, "machine", lambda: here)
    monkeypatch.setitem(run_module.RUNNERS, "learning", lambda quick, base=None: {"gain": 0.4})
    monkeypatch.setitem(run_module.PLOTS, "learning", lambda res: None)
    monkeypatch.setattr(run_module, "render", lambda res: "table")
    monkeypatch.setattr(run_module, "write_results", lambda path, res, table: written.update(res))
    written: dict = {}
    args = ["--only", "learning", "--write", "--results", str(tmp_path / "RESULTS.md")]
    assert run_module.main(args) == 0
    assert written["machine"] == full  # before: the header said trl "not installed" for the vs_trl row
    assert written["vs_trl"]["ratio"] == 1.0
    from bench_lib import ran_lines  # what run_report.write_results heads RESULTS.md with

    lines = ran_lines(written, ["vs_trl", "learning"]).splitlines()
    assert lines[0].endswith("-> (1, 1, 1)")
    assert lines[1].endswith("(its own set-up: torch threads 1, trl not installed)")
