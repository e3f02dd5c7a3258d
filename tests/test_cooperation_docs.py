"""docs/cooperation.md's Python example runs as written (on the tiny model, one batch, 4 held-out problems)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_cooperation_docs_python_example_validates_and_trains():
    text = (ROOT / "docs" / "cooperation.md").read_text()
    (code,) = re.findall(r"```python\n(.*?)```", text, re.S)
    assert 'AGENT = "builtin:smollm2-135m-instruct"' in code and "NUM_BATCHES = 12" in code
    code = code.replace('AGENT = "builtin:smollm2-135m-instruct"', 'AGENT = "builtin:tiny-gpt2"')
    code = code.replace("NUM_BATCHES = 12", "NUM_BATCHES = 1").replace(
        "val_batch_size=50", "val_batch_size=4, num_held_out=4"
    )
    scope = {"__name__": "docs"}
    exec(compile(code, "docs/cooperation.md", "exec"), scope)
    assert scope["trainer"].global_step == 2  # one batch: one step per agent
    assert len(scope["data"].val_rows) == 4
