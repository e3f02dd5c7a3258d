"""IAC and MAAC against MAGRPO on the toy length-coordination task: reward at start and end, step time.

    python benchmarks/learning/actor_critic.py                  # 150 batches each (~10 min on 2 busy CPU cores)
    python benchmarks/learning/actor_critic.py --batches 40     # quicker
    python benchmarks/learning/actor_critic.py --separate       # IAC with a separate tiny-GPT-2 critic per agent

Every trainer starts from the same seed (so the same initial agent weights and the same episode
order) and generates the same samples per step (batch 4, K = 4, 48 new tokens): the rewards of the
first and last 20% of batches are comparable, and so are the step times, measured in this one process
one trainer after the other (medians after two warm-up steps). The ratio column divides by MAGRPO's
median step time from the same run. Critics: IAC's default (a value head on each agent's trunk, one
joint loss) or, with ``--separate``, a tiny GPT-2 per agent; MAAC's centralised tiny GPT-2.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import lightning.pytorch as pl
import torch

from comlrl_lightning import IAC, MAAC, MAGRPO, ActorCriticRolloutConfig, CriticConfig, CriticSpec
from comlrl_lightning.core.config import RolloutConfig, SamplingConfig
from comlrl_lightning.datamodules import LengthRatioDataModule

K, BATCH, NEW_TOKENS, LR = 4, 4, 48, 1e-3


class Record(pl.Callback):
    """Per batch: the mean reward and the step time the module reports."""

    def __init__(self) -> None:
        self.rewards: list[float] = []
        self.step_s: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.rewards.append(float(outputs["rewards"].mean()))
        self.step_s.append(float(outputs["step_time_s"]))


def build(name: str, separate: bool) -> tuple[pl.LightningModule, int]:
    """The module and how many optimizer steps it takes per batch."""
    sampling = SamplingConfig(max_new_tokens=NEW_TOKENS)
    if name == "MAGRPO":
        return MAGRPO("builtin:tiny-gpt2", num_agents=2, rollout=RolloutConfig(num_generations=K), sampling=sampling,
                      learning_rate=LR), 2  # fmt: skip
    cls = IAC if name == "IAC" else MAAC
    critics = CriticSpec(model="builtin:tiny-gpt2") if (separate or cls is MAAC) else None
    model = cls("builtin:tiny-gpt2", num_agents=2, critics=critics, critic=CriticConfig(critic_learning_rate=LR),
                rollout=ActorCriticRolloutConfig(num_generations=K), sampling=sampling, learning_rate=LR)  # fmt: skip
    return model, 2 + len(model.separate_critics)


def run(name: str, batches: int, separate: bool) -> dict[str, float]:
    pl.seed_everything(0)
    model, steps_per_batch = build(name, separate)
    record = Record()
    trainer = pl.Trainer(accelerator="cpu", max_steps=batches * steps_per_batch, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                         limit_val_batches=0, callbacks=[record])  # fmt: skip
    trainer.fit(model, LengthRatioDataModule(batch_size=BATCH, num_train=BATCH * batches, seed=0))
    n = max(len(record.rewards) // 5, 1)
    return {"first": statistics.mean(record.rewards[:n]), "last": statistics.mean(record.rewards[-n:]),
            "step_s": statistics.median(record.step_s[2:] or record.step_s)}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batches", type=int, default=150)
    parser.add_argument("--separate", action="store_true", help="IAC with a separate critic model per agent")
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    t0 = time.time()
    results = {name: run(name, args.batches, args.separate) for name in ("MAGRPO", "IAC", "MAAC")}
    base = results["MAGRPO"]["step_s"]
    print(f"toy length ratio, 2 tiny-gpt2 agents, {args.batches} batches x {BATCH} episodes x K={K}, seed 0, "
          f"IAC critics: {'separate tiny-gpt2' if args.separate else 'heads on the trunks'}; load avg "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; {time.time() - t0:.0f} s in all")  # fmt: skip
    print("| trainer | reward first 20% | reward last 20% | gain | median step (s) | step / MAGRPO |")
    print("|---|---|---|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {r['first']:.3f} | {r['last']:.3f} | {r['last'] - r['first']:+.3f} | {r['step_s']:.3f} | "
              f"{r['step_s'] / base:.2f} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
