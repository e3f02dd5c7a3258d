"""Memory the trainer holds between steps (issue 12 §5: peak RSS of the main job)."""

import subprocess
import sys

import pytest

from comlrl_lightning import MAGRPO
from comlrl_lightning.datamodules import LengthRatioDataModule


def test_no_agent_keeps_gradients_after_its_optimizer_step(trainer_factory):
    # a gradient kept until the agent's next zero_grad is alive during every other agent's backward
    model = MAGRPO(
        agents="builtin:tiny-gpt2", num_agents=2, num_generations=2, max_new_tokens=6, learning_rate=1e-3
    )
    trainer_factory(max_steps=MAGRPO.max_steps_for(2, 2)).fit(
        model, LengthRatioDataModule(batch_size=2, num_train=8)
    )
    assert model.global_step == 4
    assert all(p.grad is None for p in model.agents.parameters())


FRAGMENT = """
import sys, torch
from comlrl_lightning.infra.memory import release_freed_memory
def rss_mb():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 1024
if sys.argv[1] == "1":
    assert release_freed_memory()
base, keep = rss_mb(), []
for step in range(3):  # three "steps": 2-4 MiB tensors freed at the end, small live ones in between
    big = []
    for i in range(150):
        big.append(torch.ones(256 * 1024 * (2 + (i + step) % 3)))
        keep.append(torch.ones(4096))
    del big
print(rss_mb() - base)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_freed_tensors_leave_the_resident_set_with_a_fixed_mmap_threshold(tmp_path):
    script = tmp_path / "fragment.py"
    script.write_text(FRAGMENT)
    kept = [float(subprocess.run([sys.executable, str(script), flag], capture_output=True, text=True,
                                 check=True).stdout) for flag in ("0", "1")]  # fmt: skip
    # ~1.3 GB was allocated per step; glibc's adaptive threshold keeps hundreds of MB of it
    assert kept[0] > 300 and kept[1] < 100, kept


def test_the_cli_fixes_the_mmap_threshold(monkeypatch):
    from comlrl_lightning import cli

    calls = []
    monkeypatch.setattr(cli, "release_freed_memory", lambda: calls.append(1) or True)
    monkeypatch.setattr(cli, "CoMLRLCLI", lambda *a, **k: None)
    cli.main(["fit"])
    assert calls == [1]
