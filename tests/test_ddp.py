"""Data parallel: MAGRPO under Lightning's DDP, 2 CPU processes over gloo.

Lightning's ``ddp`` launcher re-runs the calling script for rank 1, so the fit lives in a small
standalone script (written to tmp_path) run with ``subprocess``; each rank writes what it saw.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import hashlib, json, os, sys
    os.environ["HF_HUB_OFFLINE"] = "1"
    import torch
    import lightning.pytorch as pl
    from comlrl_lightning import MAGRPO
    from comlrl_lightning.datamodules import LengthRatioDataModule

    torch.set_num_threads(1)
    out_dir = sys.argv[1]
    pl.seed_everything(0)

    def digest(module):
        flat = torch.cat([p.detach().double().flatten() for p in module.parameters()])
        return hashlib.sha256(flat.numpy().tobytes()).hexdigest()

    class Record(pl.Callback):
        def __init__(self):
            self.seen, self.local, self.synced, self.losses = [], [], [], []

        def on_train_start(self, trainer, pl_module):
            self.initial = [digest(a) for a in pl_module.agents]

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.seen.append([e.index for e in batch])
            self.local.append(float(outputs["rewards"].mean()))
            self.synced.append(float(trainer.callback_metrics["reward"]))
            self.losses.append([s["loss"] for s in outputs["agent_stats"]])

    rec = Record()
    model = MAGRPO(agents="builtin:tiny-gpt2", num_agents=2, num_generations=2, max_new_tokens=8,
                   learning_rate=1e-2, beta=0.1)
    trainer = pl.Trainer(strategy="ddp_find_unused_parameters_true", accelerator="cpu", devices=2,
                         max_steps=2 * 3, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
                         callbacks=[rec])
    trainer.fit(model, LengthRatioDataModule(batch_size=2, num_train=16))
    result = dict(rank=trainer.global_rank, world=trainer.world_size, global_step=trainer.global_step,
                  seen=rec.seen, local=rec.local, synced=rec.synced, losses=rec.losses, initial=rec.initial,
                  final=[digest(a) for a in model.agents], ref=[digest(r) for r in model.reference_models])
    with open(os.path.join(out_dir, f"rank{trainer.global_rank}.json"), "w") as fh:
        json.dump(result, fh)
    """
)


def test_two_process_ddp_shards_episodes_and_keeps_ranks_identical(tmp_path):
    script = tmp_path / "ddp_fit.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    for key in ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    proc = subprocess.run([sys.executable, str(script), str(tmp_path)], env=env, capture_output=True, text=True,
                          timeout=180, cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    r0, r1 = (json.loads((tmp_path / f"rank{i}.json").read_text()) for i in range(2))
    assert (r0["rank"], r1["rank"], r0["world"]) == (0, 1, 2)
    assert r0["global_step"] == r1["global_step"] == 6  # 3 batches x 2 agents on each rank
    # the rank-aware ResumableSampler: disjoint episodes, together covering the first 12 of the epoch
    seen0, seen1 = sum(r0["seen"], []), sum(r1["seen"], [])
    assert len(seen0) == len(seen1) == 6 and not set(seen0) & set(seen1)
    # ranks trained on different data (different local rewards/losses) ...
    assert r0["losses"] != r1["losses"] and r0["local"] != r1["local"]
    # ... yet gradients were all-reduced: every agent ends bit-identical across ranks, and it moved
    assert r0["final"] == r1["final"] and r0["initial"] == r1["initial"]
    assert all(f != i for f, i in zip(r0["final"], r0["initial"]))
    assert r0["ref"] == r1["ref"]
    # sync_dist: the logged reward is the mean of the two ranks' local rewards, the same on both
    for a, b, s0, s1 in zip(r0["local"], r1["local"], r0["synced"], r1["synced"]):
        assert abs(s0 - s1) < 1e-6 and abs(s0 - (a + b) / 2) < 1e-5


@pytest.mark.parametrize("module", ["MADPOIter", "MARLHFIter"])
def test_the_iterative_trainers_refuse_several_processes_before_any_model_loads(
    module, monkeypatch, tmp_path
):
    """A round's pairs, replay shards and history folders are written by one process: a fit whose
    trainer has 2 processes stops in ``setup``, before ``configure_model`` loads an agent (here any load
    raises), naming the process count."""
    import lightning.pytorch as pl

    import comlrl_lightning
    from comlrl_lightning.datamodules import LengthRatioDataModule
    from comlrl_lightning.team import kinds as kinds_mod

    monkeypatch.setattr(
        kinds_mod, "load_agent", lambda *a: (_ for _ in ()).throw(AssertionError("a model loaded"))
    )
    monkeypatch.setattr(pl.Trainer, "world_size", property(lambda self: 2))  # as under DDP, one process
    model = getattr(comlrl_lightning, module)(agents=["builtin:tiny-gpt2"] * 2)
    trainer = pl.Trainer(
        accelerator="cpu", logger=False, enable_progress_bar=False, default_root_dir=tmp_path
    )
    with pytest.raises(ValueError, match=rf"^{module}\w*: 2 processes; a round's pairs, replay shards"):
        trainer.fit(model, LengthRatioDataModule(num_train=4, batch_size=2))
    assert len(model.agents) == 0
