"""The sharded strategy (``strategy: fsdp2``) on CPU, 2 gloo ranks against 1 process, in one run:

1. **memory**: per-rank bytes of parameters (agents and reference models) + gradients + AdamW state,
   FSDP2 over 2 ranks against one unsharded process, read from the tensors themselves (a DTensor
   counts its local shard) during a real MAGRPO fit (N=2, beta > 0), and the ratio;
2. **step time**: seconds per training batch, 2 ranks × ``B`` episodes against 1 process × ``2B``
   (the same global batch), medians after a warm-up batch, and the ratio;
3. **generation**: one sharded agent's rollout (``B·K`` rows) either with its sharded weights
   (FSDP2 all-gathers every block at every decoding step; HF ``synced_gpus`` keeps the ranks
   stepping together) or gathered once for the rollout (``infra.sharded.gathered``, what the
   strategy does), tokens/s of each and the ratio, plus each option's extra bytes per rank.

    python benchmarks/speed/sharded.py            # prints the section's JSON and markdown
    python benchmarks/run.py --only sharded --write

Every number of a ratio comes from this one run; the load average is recorded at start and end.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
HERE = os.path.dirname(os.path.abspath(__file__))
MODEL = "builtin:tiny-llama-gpt2tok"
"""~3.3M parameters, Llama blocks (``LlamaDecoderLayer``): big enough that sharding is visible."""


# ------------------------------------------------------------------ workers (run in child processes)
def _local_bytes(t: Any) -> int:
    t = t.to_local() if hasattr(t, "to_local") else t
    return t.numel() * t.element_size()


def fit_worker(out: str, strategy: str, devices: int, batch_size: int, batches: int) -> None:
    """A MAGRPO fit (N=2, beta=0.1); rank 0 writes ``out``: bytes per rank and seconds per batch."""
    import lightning.pytorch as pl
    import torch

    from comlrl_lightning import MAGRPO
    from comlrl_lightning.datamodules import LengthRatioDataModule

    torch.set_num_threads(1)
    pl.seed_everything(0)

    class Measure(pl.Callback):
        def __init__(self) -> None:
            self.grad_bytes: dict[int, int] = {}
            self.batch_s: list[float] = []

        def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
            params = [p for g in optimizer.param_groups for p in g["params"]]
            self.grad_bytes[id(optimizer)] = sum(_local_bytes(p.grad) for p in params if p.grad is not None)

        def on_train_batch_start(self, *args) -> None:
            self.t0 = time.perf_counter()

        def on_train_batch_end(self, *args) -> None:
            self.batch_s.append(time.perf_counter() - self.t0)

    rec = Measure()
    model = MAGRPO(
        agents=MODEL, num_agents=2, num_generations=2, max_new_tokens=16, learning_rate=1e-5, beta=0.1
    )
    trainer = pl.Trainer(strategy=strategy, accelerator="cpu", devices=devices, max_steps=2 * batches, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         num_sanity_val_steps=0, limit_val_batches=0, callbacks=[rec])  # fmt: skip
    trainer.fit(model, LengthRatioDataModule(batch_size=batch_size, num_train=64))
    models = list(model.agents) + list(model.reference_models)
    params = sum(_local_bytes(p) for m in models for p in m.parameters())
    state = sum(
        _local_bytes(v)
        for opt in trainer.optimizers
        for s in opt.state.values()
        for k, v in s.items()
        if torch.is_tensor(v) and k != "step"
    )
    if trainer.global_rank == 0:
        with open(out, "w") as fh:
            json.dump({"param_bytes": params, "grad_bytes": sum(rec.grad_bytes.values()), "optimizer_state_bytes": state,
                       "batch_s": rec.batch_s, "world_size": trainer.world_size}, fh)  # fmt: skip


def generation_worker(rank: int, world: int, port: int, out: str, reps: int) -> None:
    """Both rollout options of one sharded agent, alternated (A B A B); rank 0 writes ``out``."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from comlrl_lightning.infra.sharded import gathered, shard_model
    from comlrl_lightning.team.agents import AgentSpec, load_agent

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    torch.manual_seed(0)
    model, tok = load_agent(AgentSpec(model=MODEL))
    full_bytes = sum(_local_bytes(p) for p in model.parameters())
    blocks = [sum(_local_bytes(p) for p in b.parameters()) for b in model.model.layers]
    shard_model(model, init_device_mesh("cpu", (world,)), None, True)
    prompts = [f"Write a short line about item {rank * 100 + i}:" for i in range(4)]
    times: dict[str, list[float]] = {"sharded": [], "gathered": []}
    tokens: dict[str, list[int]] = {"sharded": [], "gathered": []}

    enc = tok(prompts, return_tensors="pt", padding=True)
    knobs = dict(max_new_tokens=32, do_sample=True, temperature=1.0, num_return_sequences=2,
                 pad_token_id=tok.pad_token_id, eos_token_id=None)  # fmt: skip

    def run(option: str) -> None:
        dist.barrier()
        t0 = time.perf_counter()
        with torch.no_grad():
            if option == "sharded":  # every decoding step all-gathers: HF's synced_gpus keeps ranks in step
                ids = model.generate(**enc, **knobs, synced_gpus=True)
            else:
                with gathered(model):
                    ids = model.generate(**enc, **knobs)
        times[option].append(time.perf_counter() - t0)
        tokens[option].append(int(ids.shape[0] * (ids.shape[1] - enc["input_ids"].shape[1])))

    for _ in range(reps):
        for option in ("sharded", "gathered"):
            run(option)
    if rank == 0:
        with open(out, "w") as fh:
            json.dump({"times": times, "tokens": tokens, "full_param_bytes": full_bytes,
                       "largest_block_bytes": max(blocks),
                       "outside_blocks_bytes": full_bytes - sum(blocks), "world_size": world}, fh)  # fmt: skip
    dist.destroy_process_group()


# ------------------------------------------------------------------ the section
def _child(args: list[str], timeout: int = 900) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for key in ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "RANK"):
        env.pop(key, None)
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), *args], env=env, capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"benchmarks/speed/sharded.py {' '.join(args)} failed:\n{proc.stderr[-3000:]}")


def _port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def section(quick: bool = False) -> dict[str, Any]:
    """``run.py --only sharded``: the fits (1 process, then 2 ranks) and the generation options."""
    batches, reps, b = (2, 1, 2) if quick else (4, 3, 2)
    res: dict[str, Any] = {
        "model": MODEL,
        "batches": batches,
        "episodes_per_rank": b,
        "load": [os.getloadavg()],
    }
    with tempfile.TemporaryDirectory() as tmp:
        for name, strategy, devices, bs in (("one", "auto", 1, 2 * b), ("two", "fsdp2", 2, b)):
            out = os.path.join(tmp, f"{name}.json")
            _child(["fit", out, strategy, str(devices), str(bs), str(batches)])
            with open(out) as fh:
                res[name] = json.load(fh)
            res["load"].append(os.getloadavg())
        out = os.path.join(tmp, "gen.json")
        _child(["generation", out, str(reps), str(_port())])
        with open(out) as fh:
            res["generation"] = json.load(fh)
        res["load"].append(os.getloadavg())
    return res


def _total(r: dict[str, Any]) -> int:
    return r["param_bytes"] + r["grad_bytes"] + r["optimizer_state_bytes"]


def render(res: dict[str, Any]) -> str:
    """The markdown of the ``sharded`` section."""
    one, two, gen = res["one"], res["two"], res["generation"]
    mib = 2**20
    rows = [f"| {k} | {one[k] / mib:.2f} | {two[k] / mib:.2f} | {two[k] / one[k]:.3f} |"
            for k in ("param_bytes", "grad_bytes", "optimizer_state_bytes")]  # fmt: skip
    ratio = _total(two) / _total(one)
    t1, t2 = statistics.median(one["batch_s"][1:]), statistics.median(two["batch_s"][1:])
    tps = {o: sum(gen["tokens"][o]) / sum(gen["times"][o]) for o in ("sharded", "gathered")}
    load = " → ".join(str(tuple(round(x, 2) for x in lo)) for lo in res["load"])
    return f"""`benchmarks/speed/sharded.py` via `run.py --only sharded`: MAGRPO, two `{res["model"]}` agents with
reference models (beta 0.1), K=2, 16 new tokens, AdamW; one process (no sharding, {2 * res["episodes_per_rank"]}
episodes per batch) against `strategy: fsdp2` on 2 gloo ranks ({res["episodes_per_rank"]} episodes each, the same
global batch), {res["batches"]} batches each. Load average along the run: {load} (2 cores shared).

| per-rank bytes (MiB) | 1 process | fsdp2, 2 ranks | ratio |
|---|---|---|---|
{chr(10).join(rows)}
| **params + grads + optimizer state** | {_total(one) / mib:.2f} | {_total(two) / mib:.2f} | **{ratio:.3f}** (target ≤ 0.55) |

Seconds per training batch (median after the first): 1 process {t1:.2f}, 2 ranks {t2:.2f}, ratio 2 ranks / 1 process
**{t2 / t1:.2f}** (on 2 shared CPU cores the ranks compete for the same cores; gloo collectives over loopback).

Rollout of one sharded agent ({gen["world_size"]} ranks, 4 prompts × K=2, up to 32 new tokens, {len(gen["times"]["sharded"])}
runs each, alternated): **sharded weights** (FSDP2 all-gathers every block at every decoding step, `synced_gpus`)
{tps["sharded"]:.0f} tokens/s; **gathered once** for the rollout (what `fsdp2` does) {tps["gathered"]:.0f} tokens/s,
**{tps["gathered"] / tps["sharded"]:.1f}×**. Extra memory per rank while generating: gathered, the agent's full
parameters ({gen["full_param_bytes"] / mib:.2f} MiB here; 2 bytes × parameters in bf16, e.g. 14 GiB for a 7B agent);
sharded, the weights outside the blocks (embeddings, final norm, head: the root unit, held for
the whole forward; {gen["outside_blocks_bytes"] / mib:.2f} MiB here) plus one block at a time
({gen["largest_block_bytes"] / mib:.2f} MiB here). The sharded option also needs every rank to run the same
number of decoding steps (`synced_gpus`) and a `generate` outside `inference_mode` (FSDP2 would otherwise
gather into inference tensors that training cannot reuse); the gathered option needs neither.
"""


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "fit":
        fit_worker(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]))
    elif len(sys.argv) > 1 and sys.argv[1] == "generation":
        import torch.multiprocessing as mp

        mp.spawn(generation_worker, args=(2, int(sys.argv[4]), sys.argv[2], int(sys.argv[3])), nprocs=2)
    else:
        result = section(quick="--quick" in sys.argv)
        print(json.dumps(result))
        print(render(result))
