"""docs/agents.md: its quoted code is the code, and its "adding a kind" example runs and does what it says
(a kind added through the team factory alone: the optimizers step only what the kind trains)."""

import re
from pathlib import Path

from test_docs_code import appears_in, quoted_blocks

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs/agents.md"


def test_agents_doc_quotes_the_code():
    blocks = quoted_blocks(DOC.read_text())
    assert len(blocks) >= 3
    stale = [path for path, lines in blocks if not appears_in(lines, (ROOT / path).read_text().splitlines())]
    assert not stale, f"docs/agents.md quotes code that is no longer in {stale}"


def test_the_added_kind_runs_and_its_optimizers_step_only_the_biases():
    (code,) = re.findall(r"<!-- run -->\n```python\n(.*?)```", DOC.read_text(), re.S)
    scope: dict = {}
    exec(compile(code, str(DOC), "exec"), scope)
    module = scope["module"]
    names = {id(p): n for agent in module.agents for n, p in agent.named_parameters()}
    opts = [c["optimizer"] for c in module.configure_optimizers()]
    for opt in opts:
        params = [p for g in opt.param_groups for p in g["params"]]
        assert params and all(names[id(p)].endswith(".bias") for p in params)
