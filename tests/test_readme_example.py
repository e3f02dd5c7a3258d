"""The README's Python quick tour runs as written, offline (here on the tiny model, two batches)."""

import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_readme_python_example_runs_offline_and_logs_to_tensorboard(tmp_path, monkeypatch):
    readme = (ROOT / "README.md").read_text()
    (code,) = [block for block in re.findall(r"```python\n(.*?)```", readme, re.S) if "trainer.fit" in block]
    assert 'AGENT = "builtin:smollm2-135m-instruct"' in code and "NUM_BATCHES = " in code
    code = code.replace('AGENT = "builtin:smollm2-135m-instruct"', 'AGENT = "builtin:tiny-gpt2"')
    code = re.sub(r"NUM_BATCHES = \d+", "NUM_BATCHES = 2", code)
    code = code.replace('"configs/data/topics.jsonl"', repr(str(ROOT / "configs" / "data" / "topics.jsonl")))
    monkeypatch.chdir(tmp_path)  # ./runs lands here
    exec(compile(code, "README.md", "exec"), {"__name__": "readme"})
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (log_dir,) = (tmp_path / "runs" / "quick_tour").iterdir()
    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    assert len(acc.Scalars("reward")) == 2  # one point per batch
    assert "completions/text_summary" in acc.Tags()["tensors"]
    assert os.path.exists(log_dir / "hparams.yaml")
