"""A short fit for tests/test_sharded.py, run as a script (Lightning's launcher re-runs it per rank;
torchrun and the kill -9 test start the ranks themselves).

    python tests/sharded_fit.py OUT --algo magrpo|iac --strategy fsdp2|auto --devices 2 --batch-size 2
        [--num-nodes 1] [--max-batches 3] [--ckpt-every 0] [--resume PATH] [--die-after 0]
        [--real-generate] [--export] [--val] [--precision 32-true] [--accelerator cpu] [--optimizer adamw|sgd]

Completions are a seeded function of each prompt's text (``fake_generate``), so a 2-rank run and a
1-process run on the same global batch roll out the same joint actions and take the same steps;
``--real-generate`` samples with the agents (gathered per rollout) instead.
Rank 0 writes ``OUT/weights.pt``: every agent's and critic's full (gathered) parameters, fp32 CPU.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

import comlrl_lightning.team.team as team_mod
from comlrl_lightning import IAC, MAGRPO, CriticSpec
from comlrl_lightning.callbacks import AgentCheckpoint
from comlrl_lightning.core.generation import Generation, completion_mask_from_ids, tokenize_prompts
from comlrl_lightning.datamodules import LengthRatioDataModule

NO_DROPOUT = {
    "model": "builtin:tiny-gpt2",
    "model_kwargs": {"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0},
}


def fake_generate(model, tokenizer, prompt_texts, num_generations, sampling, chat_rendered, do_sample=True):
    """K completions of 6 tokens per prompt, seeded by that prompt's text alone (not the batch)."""
    ids, mask = tokenize_prompts(tokenizer, prompt_texts, chat_rendered)
    ids, mask = ids.repeat_interleave(num_generations, 0), mask.repeat_interleave(num_generations, 0)
    comps = []
    for text in prompt_texts:
        g = torch.Generator().manual_seed(sum(i * ord(c) for i, c in enumerate(text)))
        comp = torch.randint(40, 120, (num_generations, 6), generator=g)
        stop = torch.randint(2, 6, (num_generations,), generator=g)
        comp[torch.arange(num_generations), stop] = tokenizer.eos_token_id
        comps.append(comp)
    comp = torch.cat(comps)
    cmask, clipped = completion_mask_from_ids(comp, tokenizer.eos_token_id)
    texts = tokenizer.batch_decode(
        comp * cmask + tokenizer.pad_token_id * (1 - cmask), skip_special_tokens=True
    )
    return Generation(ids, mask, comp, cmask, texts, clipped)


def full_params(module: torch.nn.Module, prefix: str) -> dict[str, torch.Tensor]:
    """Every parameter of ``module``, gathered when sharded (a collective: every rank calls it)."""
    out = {}
    for name, p in module.named_parameters():
        t = p.full_tensor() if hasattr(p, "full_tensor") else p
        out[f"{prefix}.{name}"] = t.detach().float().cpu().clone()
    return out


class Die(pl.Callback):
    """SIGKILL this process after ``batches`` training batches (the kill -9 test)."""

    def __init__(self, batches: int) -> None:
        self.batches = batches

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.fit_loop.epoch_loop._batches_that_stepped >= self.batches:
            os.kill(os.getpid(), 9)


class RankSeed(pl.Callback):
    """Each rank samples from its own stream (seed 1000 + rank): identical streams would give the
    ranks correlated noise, and would hide a resume that hands rank 0's RNG state to every rank."""

    def on_fit_start(self, trainer, pl_module):
        torch.manual_seed(1000 + trainer.global_rank)


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--algo", default="magrpo")
    ap.add_argument("--strategy", default="fsdp2")
    ap.add_argument("--devices", type=int, default=2)
    ap.add_argument("--num-nodes", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=2)
    ap.add_argument("--max-batches", type=int, default=3)
    ap.add_argument("--ckpt-every", type=int, default=0)
    ap.add_argument("--resume", default=None)
    ap.add_argument("--die-after", type=int, default=0)
    ap.add_argument("--real-generate", action="store_true")
    ap.add_argument("--export", action="store_true", help="AgentCheckpoint at the end: OUT/agents/step_<n>")
    ap.add_argument("--val", action="store_true", help="one validation batch at each epoch end")
    ap.add_argument("--precision", default="32-true")
    ap.add_argument("--accelerator", default="cpu", help="gpu: benchmarks/gpu/gpu_check.py's sharded part")
    ap.add_argument(
        "--optimizer", choices=["adamw", "sgd"], default="adamw", help="sgd: plain SGD at lr 1e-2"
    )
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    if not args.real_generate:
        team_mod.generate = fake_generate
    pl.seed_everything(0)
    optimizer = functools.partial(torch.optim.SGD, lr=1e-2) if args.optimizer == "sgd" else None
    if args.algo == "magrpo":
        model = MAGRPO(
            agents=NO_DROPOUT,
            num_agents=2,
            num_generations=2,
            max_new_tokens=8,
            learning_rate=1e-2,
            beta=0.1,
            optimizer=optimizer,
        )
    else:  # batch-wide advantage normalisation is per rank under data parallelism (as under DDP): off here
        model = IAC(agents=NO_DROPOUT, num_agents=2, rollout={"num_generations": 2}, sampling={"max_new_tokens": 8},
                    learning_rate=1e-2, critics=CriticSpec(model="builtin:tiny-gpt2", model_kwargs=NO_DROPOUT["model_kwargs"]),
                    critic={"advantage_normalization": False, "critic_learning_rate": 1e-2}, optimizer=optimizer)  # fmt: skip
    callbacks: list[pl.Callback] = [RankSeed()] if args.real_generate else []
    if args.ckpt_every:
        callbacks.append(ModelCheckpoint(dirpath=os.path.join(args.out, "ckpt"), every_n_train_steps=args.ckpt_every * model.steps_per_batch,
                                         save_top_k=-1, save_last=False))  # fmt: skip
    if args.die_after:
        callbacks.append(Die(args.die_after))
    if args.export:
        callbacks.append(AgentCheckpoint(dirpath=os.path.join(args.out, "agents"), every_n_steps=0))
    trainer = pl.Trainer(
        strategy=args.strategy, accelerator=args.accelerator, precision=args.precision, devices=args.devices, num_nodes=args.num_nodes,
        max_steps=args.max_batches * model.steps_per_batch, logger=False, enable_checkpointing=bool(args.ckpt_every),
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=1 if args.val else 0,
        callbacks=callbacks, default_root_dir=args.out,
    )  # fmt: skip
    trainer.fit(model, LengthRatioDataModule(batch_size=args.batch_size, num_train=16), ckpt_path=args.resume)
    weights = {}
    for i, agent in enumerate(model.agents):
        weights.update(full_params(agent, f"agent{i}"))
    for c, critic in enumerate(getattr(model, "critics", [])):
        weights.update(full_params(critic, f"critic{c}"))
    if trainer.global_rank == 0:
        weights["_global_step"] = torch.tensor(trainer.global_step)
        weights["_world_size"] = torch.tensor(trainer.world_size)
        torch.save(weights, os.path.join(args.out, "weights.pt"))
    if torch.distributed.is_initialized():  # a clean exit: torchrun's agents wait on every worker
        # every rank past rank 0's save before any tears down: in CI at load 10 node 1's worker aborted
        # ("terminate called without an active exception", SIGABRT) while node 0 was still saving
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
