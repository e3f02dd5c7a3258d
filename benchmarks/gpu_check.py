"""GPU check of AgentParallelStrategy: a 2-agent fit with agent 0 on ``cuda:0`` and agent 1 on ``cpu``
(plus KL reference models next to their agents), a checkpoint, a resume from it, and a report of
where every parameter and every optimizer state tensor lives, per agent and per device.

    python benchmarks/gpu_check.py          # exits 1 if anything is on the wrong device

Without a GPU it prints that no GPU is available and exits 0. ``run("cpu", "cpu")`` exercises the
same code path on CPU (used while developing it).
"""

from __future__ import annotations

import collections
import sys
import tempfile
from pathlib import Path

import torch


def placement(module, optimizers) -> dict:
    """``{agent: {"params": {device: n}, "optimizer_state": {device: n}, "reference": {device: n}}}``."""
    report = {}
    for i, agent in enumerate(module.agents):
        params = list(agent.parameters())
        ids = {id(p) for p in params}
        state = collections.Counter()
        for p, s in optimizers[i].state.items():
            assert id(p) in ids, "an optimizer holds another agent's parameter"
            for key, v in s.items():
                if torch.is_tensor(v) and key != "step":
                    state[str(v.device)] += 1
        entry = {
            "params": dict(collections.Counter(str(p.device) for p in params)),
            "optimizer_state": dict(state),
        }
        if len(module.reference_models):
            entry["reference"] = dict(collections.Counter(str(p.device) for p in module.reference_models[i].parameters()))
        report[i] = entry
    return report


def run(agent0: str = "cuda:0", accelerator: str = "gpu", steps: int = 4) -> bool:
    import lightning.pytorch as pl
    from comlrl_lightning.datamodules import LengthRatioDataModule
    from lightning.pytorch.callbacks import ModelCheckpoint

    from comlrl_lightning import MAGRPO, AgentParallelStrategy, LossConfig, RolloutConfig, SamplingConfig

    expected = {0: torch.device(agent0), 1: torch.device("cpu")}
    reports: dict[str, dict] = {}

    class Report(pl.Callback):
        def __init__(self, name: str) -> None:
            self.name = name

        def on_train_start(self, trainer, pl_module):  # after the checkpoint (if any) was restored
            reports[f"{self.name}: start"] = placement(pl_module, trainer.optimizers)

        def on_train_end(self, trainer, pl_module):  # before teardown moves everything to CPU
            reports[f"{self.name}: end"] = placement(pl_module, trainer.optimizers)

    def fit(name: str, max_steps: int, ckpt_dir: Path, ckpt_path: str | None) -> pl.Trainer:
        pl.seed_everything(0)
        model = MAGRPO(agents="builtin:tiny-gpt2", num_agents=2, rollout=RolloutConfig(num_generations=4),
                       sampling=SamplingConfig(max_new_tokens=16), loss=LossConfig(beta=0.05),
                       learning_rate=1e-3)  # fmt: skip
        strategy = AgentParallelStrategy(agent_devices=[agent0, "cpu"])
        trainer = pl.Trainer(strategy=strategy, accelerator=accelerator, devices=1, max_steps=max_steps, logger=False,
                             enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                             limit_val_batches=0, callbacks=[Report(name), ModelCheckpoint(dirpath=ckpt_dir, save_last=True,
                             every_n_train_steps=2 * 2, save_top_k=0)])  # fmt: skip
        trainer.fit(model, LengthRatioDataModule(batch_size=2, num_train=32), ckpt_path=ckpt_path)
        print(f"{name}: global_step={trainer.global_step}, root={strategy.root_device}, plan={strategy.plan}")
        return trainer

    with tempfile.TemporaryDirectory() as tmp:
        fit("fit", steps, Path(tmp), None)
        fit("resume", 2 * steps, Path(tmp), str(Path(tmp) / "last.ckpt"))

    ok = True
    for name, report in reports.items():
        print(f"\n[{name}]")
        for agent, entry in report.items():
            print(f"  agent {agent}: " + "; ".join(f"{k} {v}" for k, v in entry.items()))
            want = str(expected[agent])
            for kind, counts in entry.items():
                if kind == "optimizer_state" and not counts and name.startswith("fit: start"):
                    continue  # fresh optimizer: no state yet
                if set(counts) != {want}:
                    ok = False
                    print(f"    WRONG: agent {agent} {kind} should all be on {want}")
    print("\nOK: every parameter and optimizer state tensor is on its agent's device" if ok else "\nFAILED")
    return ok


def main() -> int:
    if not torch.cuda.is_available():
        print("gpu_check: no GPU available; nothing to check.")
        return 0
    return 0 if run() else 1


if __name__ == "__main__":
    sys.exit(main())
