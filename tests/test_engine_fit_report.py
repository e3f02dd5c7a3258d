"""benchmarks/learning/engine_fit.py's reading of the fit summary and its verdict against the HF run's interval."""

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH / "lib"))
import bench_paths  # noqa: E402,F401 - every benchmarks/<concern>/ on sys.path
import engine_fit as E  # noqa: E402

HF_LINE = "held-out team success: 0.300 -> 0.660; gain +0.360, 95% interval [+0.180, +0.520] paired over 50 problems (excludes 0)"


def test_the_gain_is_read_from_the_summary_line_the_cli_prints():
    assert E.parse_gain(["val/reward: 0.300 -> 0.660 (+0.360, 2 points)", HF_LINE]) == {
        "before": 0.3, "after": 0.66, "gain": 0.36, "lo": 0.18, "hi": 0.52}  # fmt: skip
    assert E.parse_gain(["val/reward: 0.300 -> 0.660"]) is None


def _res(engine_line, code=0):
    return {"engine": E.parse_gain([engine_line]), "hf": E.parse_gain([HF_LINE]), "returncode": code,
            "config": E.CONFIG, "extra": ["--x"], "wall_s": 600.0, "loadavg_start": [1.0], "loadavg_end": [2.0],
            "hf_record": {"commit": "241c93def7aa", "date": "2026-12-05 05:13", "wall_s": 756,
                          "loadavg_start": [2.3], "loadavg_end": [7.1]}}  # fmt: skip


def test_the_verdict_is_whether_the_engine_gain_lies_in_the_hf_interval():
    inside = "held-out team success: 0.300 -> 0.500; gain +0.200, 95% interval [+0.040, +0.360] paired"
    outside = "held-out team success: 0.300 -> 0.400; gain +0.100, 95% interval [-0.040, +0.240] paired"
    for line, word in ((inside, "is inside it"), (outside, "is **outside** it")):
        res = _res(line)
        res["inside_hf_interval"] = E.within(res["engine"], res["hf"])
        assert word in E.render(res)
    assert E.within(None, res["hf"]) is None and E.within(res["hf"], res["hf"]) is True
    assert "the fit failed (exit code 1)" in E.render({**_res(inside, code=1), "inside_hf_interval": None})


def test_the_blocks_come_from_the_configs_header_and_the_baseline_is_the_default_configs_last_good_run(
    tmp_path, monkeypatch
):
    import json

    import cooperation_main_job

    assert E.blocks() == ["--config", "configs/trainer/cpu.yaml"]  # the line `make run` reads too
    recs = [{"make_args": [], "returncode": 0, "n": 1}, {"make_args": [], "returncode": 2, "n": 2},
            {"make_args": ["CONFIG=configs/coop_division.yaml"], "returncode": 0, "n": 3}]  # fmt: skip
    path = tmp_path / "main_job.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    monkeypatch.setattr(cooperation_main_job, "RECORDS", str(path))
    assert E.hf_record()["n"] == 1
