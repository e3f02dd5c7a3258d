"""Shared pieces of the benchmarks: one setup, seeded initial weights, our module under Lightning.

Every system of a comparison starts from the same weights (:func:`initial_states`), reads the same
episodes (:func:`task`) and samples with the same knobs (:class:`Setup`). Our module runs through
``pl.Trainer.fit`` (how users run it); the peers run *inside* that loop, at the start of every batch,
on the same batch (:class:`Harness`), so the systems alternate A B A B ... in one process.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import os
import statistics
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

warnings.filterwarnings("ignore")

import lightning.pytorch as pl  # noqa: E402

for _name in ("lightning", "lightning.pytorch", "lightning.fabric", "transformers", "accelerate"):
    logging.getLogger(_name).setLevel(logging.ERROR)
import transformers  # noqa: E402

transformers.utils.logging.disable_progress_bar()

from comlrl_lightning import MAGRPO, LossConfig, RolloutConfig, SamplingConfig  # noqa: E402
from comlrl_lightning.datamodules import DecPOMDPDataModule, LengthRatioDataModule  # noqa: E402
from comlrl_lightning.envs.toy import LengthRatioReward, TargetLengthReward, length_ratio_rows  # noqa: E402
from comlrl_lightning.team.agents import (  # noqa: E402
    AgentSpec,
    build_tiny_gpt2,
    byte_tokenizer,
    disable_dropout,
    load_agent,
    load_tokenizer,
)

TINY = "builtin:tiny-gpt2"
SMOLLM2 = "builtin:smollm2-135m-instruct"
FORMATTERS_2 = ("Short note on {topic}:", "Longer note on {topic}:")


@dataclass(frozen=True)
class Setup:
    """Everything that must be equal across the systems of one comparison."""

    num_agents: int = 2
    k: int = 4  # num_generations
    batch_size: int = 4  # episodes per optimizer step (CoMLRL: rollout_buffer_size)
    max_new_tokens: int = 32
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: off (HF would otherwise default to 50)
    lr: float = 1e-3
    seed: int = 0
    model: str = TINY
    dtype: str = "float32"
    device: str = "cpu"
    loss_aggregation: str = "sequence_sum"
    share_weights: bool = False  # agents 1.. share agent 0's weights

    @property
    def samples_per_step(self) -> int:
        """Trained samples per optimizer round: episodes × K × agents."""
        return self.batch_size * self.k * self.num_agents

    def with_(self, **kw: Any) -> Setup:
        return replace(self, **kw)


_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def torch_dtype(setup: Setup) -> torch.dtype:
    return _DTYPES[setup.dtype]


# --------------------------------------------------------------------------- models
def tokenizer_for(setup: Setup) -> Any:
    return byte_tokenizer() if setup.model == TINY else load_tokenizer(AgentSpec(model=setup.model))


_STATE_CACHE: dict[tuple, list[dict[str, torch.Tensor]]] = {}


def initial_states(setup: Setup) -> list[dict[str, torch.Tensor]] | None:
    """Tiny GPT-2: one state dict per agent, seeded with ``seed + i``. Pretrained models: ``None``
    (every load of the checkpoint already gives the same weights; no extra copy is kept)."""
    if setup.model != TINY:
        return None
    key = (setup.model, setup.seed, setup.num_agents)
    if key not in _STATE_CACHE:
        tok = byte_tokenizer()
        states = []
        for i in range(setup.num_agents):
            torch.manual_seed(setup.seed + i)
            states.append({k: v.clone() for k, v in build_tiny_gpt2(tok).state_dict().items()})
        _STATE_CACHE[key] = states
    return _STATE_CACHE[key]


def fresh_model(setup: Setup, agent: int, tokenizer: Any | None = None) -> torch.nn.Module:
    """A new model object of ``setup.model`` holding agent ``agent``'s initial weights.

    Dropout is off, as in the models our module loads (``load_agent``), so every system runs the same net.
    """
    states = initial_states(setup)
    if states is not None:
        model = disable_dropout(build_tiny_gpt2(tokenizer or byte_tokenizer()))
        model.load_state_dict(states[agent])
    else:
        model, _ = load_agent(AgentSpec(model=setup.model))
    return model.to(device=setup.device, dtype=torch_dtype(setup))


@torch.no_grad()
def sync_weights(dst: torch.nn.Module, src: torch.nn.Module) -> None:
    """Copy ``src``'s parameters into ``dst`` in place (optimizers keep pointing at ``dst``'s tensors)."""
    for (_, p), (_, q) in zip(dst.named_parameters(), src.named_parameters(), strict=True):
        p.copy_(q)


# --------------------------------------------------------------------------- task
class ChainRatioReward:
    """N-agent length coordination: mean over consecutive pairs of :class:`LengthRatioReward`."""

    name = "chain_ratio"

    def __init__(self) -> None:
        self.pair = LengthRatioReward()

    def __call__(
        self, joint_actions: Sequence[Sequence[str]], episodes: Sequence[Any], turn: int
    ) -> list[float]:
        return [
            sum(self.pair.score(a, b) for a, b in zip(ja, ja[1:])) / (len(ja) - 1) for ja in joint_actions
        ]


def formatters(num_agents: int) -> list[str]:
    if num_agents == 1:
        return ["Note on {topic}:"]
    if num_agents == 2:
        return list(FORMATTERS_2)
    return [f"Note {i} on {{topic}}:" for i in range(num_agents)]


def reward_for(num_agents: int) -> Any:
    if num_agents == 1:
        return TargetLengthReward(16)
    return LengthRatioReward() if num_agents == 2 else ChainRatioReward()


def datamodule(setup: Setup, num_batches: int) -> DecPOMDPDataModule:
    """Episodes in a fixed order (no shuffle), ``num_batches`` batches of ``setup.batch_size``."""
    n = num_batches * setup.batch_size
    if setup.num_agents == 2:
        return LengthRatioDataModule(
            num_train=n, num_val=1, batch_size=setup.batch_size, shuffle=False, seed=setup.seed
        )
    return DecPOMDPDataModule(length_ratio_rows(n, setup.seed), formatters(setup.num_agents),
                              reward_for(setup.num_agents), batch_size=setup.batch_size, shuffle=False)  # fmt: skip


# --------------------------------------------------------------------------- our module
def build_ours(setup: Setup) -> MAGRPO:
    """MAGRPO with the setup's knobs, every agent loaded with its initial weights."""
    specs = []
    for i in range(setup.num_agents):
        share = 0 if (setup.share_weights and i > 0) else None
        specs.append(AgentSpec(model=setup.model, dtype=setup.dtype, share_weights_with=share))
    module = MAGRPO(
        agents=specs, rollout=RolloutConfig(num_generations=setup.k), loss=LossConfig(loss_type=setup.loss_aggregation),
        sampling=SamplingConfig(max_new_tokens=setup.max_new_tokens, temperature=setup.temperature, top_p=setup.top_p,
                                top_k=setup.top_k),
        learning_rate=setup.lr,
    )  # fmt: skip
    module.configure_model()
    states = initial_states(setup)
    for i, (spec, agent) in enumerate(zip(module.specs, module.agents)):
        if states is not None and spec.share_weights_with is None:
            agent.load_state_dict(states[i])
    return module


def trainer_for(setup: Setup, num_batches: int, callbacks: list[pl.Callback]) -> pl.Trainer:
    accelerator = "gpu" if setup.device.startswith("cuda") else "cpu"
    return pl.Trainer(
        accelerator=accelerator, devices=1, max_steps=MAGRPO.max_steps_for(num_batches, setup.num_agents),
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, limit_val_batches=0, callbacks=callbacks,
    )  # fmt: skip


class Peer:
    """A system timed against ours: ``step(batch, module)`` trains on the same episodes, returns seconds."""

    name = "peer"

    def step(self, batch: list[Any], module: MAGRPO) -> float:  # pragma: no cover - interface
        raise NotImplementedError

    def close(self) -> None:
        pass


class Harness(pl.Callback):
    """Runs the peers at the start of every batch, then lets our step run; records both sides.

    ``loop_s[i]``: wall time of our batch i through Lightning, from when the peers finished to when
    batch i+1 starts (training_step, hooks, logging, fetching the next batch) — peers excluded.
    ``module_s[i]``: the ``step_time_s`` our training_step reports (rollout + update, in-module).
    """

    def __init__(self, peers: Sequence[Peer] = ()) -> None:
        self.peers = list(peers)
        self.peer_s: dict[str, list[float]] = {p.name: [] for p in self.peers}
        self.loop_s: list[float] = []
        self.module_s: list[float] = []
        self.rollout_s: list[float] = []
        self.rewards: list[float] = []
        self.chars: list[float] = []
        self._t: float | None = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize()  # our previous step's kernels count as ours
        now = time.perf_counter()
        if self._t is not None:
            self.loop_s.append(now - self._t)
        for p in self.peers:
            self.peer_s[p.name].append(p.step(batch, pl_module))
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize()
        self._t = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.module_s.append(float(outputs["step_time_s"]))
        self.rollout_s.append(float(outputs["rollout_time_s"]))
        self.rewards.extend(outputs["rewards"].tolist())
        texts = [t for agent in outputs["completions"] for t in agent]
        self.chars.append(sum(map(len, texts)) / max(len(texts), 1))


def fit_ours(
    setup: Setup, num_batches: int, peers: Sequence[Peer] = (), module: MAGRPO | None = None
) -> Harness:
    """Train our module for ``num_batches`` batches with ``peers`` alternating at every batch."""
    module = module or build_ours(setup)
    harness = Harness(peers)
    try:
        trainer_for(setup, num_batches, [harness]).fit(module, datamodule(setup, num_batches))
    finally:
        for p in peers:
            p.close()
    return harness


# --------------------------------------------------------------------------- statistics
def med(xs: Sequence[float], warmup: int = 2) -> float:
    """Median after dropping ``warmup`` leading values (kept if that would leave nothing)."""
    xs = list(xs)
    xs = xs[warmup:] if len(xs) > warmup else xs
    return statistics.median(xs) if xs else math.nan


def paired(a: Sequence[float], b: Sequence[float], warmup: int = 2) -> float:
    """Median over steps i of ``a[i] / b[i]``: the two systems ran back to back on batch i, so slow
    drifts of the machine's load cancel in each ratio. Drops ``warmup`` leading steps."""
    n = min(len(a), len(b))
    ratios = [a[i] / b[i] for i in range(min(warmup, max(n - 1, 0)), n)]
    return statistics.median(ratios) if ratios else math.nan


def first_last(rewards: Sequence[float], frac: float = 0.2) -> tuple[float, float]:
    """Mean reward of the first and of the last ``frac`` of the joint actions."""
    n = max(1, int(len(rewards) * frac))
    return sum(rewards[:n]) / n, sum(rewards[-n:]) / n


def unique_param_bytes(modules: Sequence[torch.nn.Module]) -> int:
    """Bytes of the distinct parameter storages of ``modules`` (shared weights counted once)."""
    seen: dict[int, int] = {}
    for m in modules:
        for p in m.parameters():
            s = p.untyped_storage()
            seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def optimizer_state_bytes(optimizers: Sequence[torch.optim.Optimizer]) -> int:
    """Bytes of the distinct tensor storages in ``optimizers``' state (AdamW: two moments per parameter)."""
    total, seen = 0, set()
    for opt in optimizers:
        for state in opt.state.values():
            for v in state.values():
                if torch.is_tensor(v) and v.untyped_storage().data_ptr() not in seen:
                    seen.add(v.untyped_storage().data_ptr())
                    total += v.untyped_storage().nbytes()
    return total


def deepcopy_model(model: torch.nn.Module) -> torch.nn.Module:
    return copy.deepcopy(model)


def ran_lines(res: dict[str, Any], sections: Sequence[str]) -> str:
    """Markdown list: when, how long and under what load each recorded section of ``res`` ran."""
    lines = []
    for name in sections:
        if name in res:
            r = res[name]["ran"]
            start, end = (tuple(round(x, 2) for x in r[k]) for k in ("loadavg_start", "loadavg_end"))
            lines.append(
                f"- `{name}`: {r['date']}, {r['wall_s'] / 60:.1f} min, load average {start} -> {end}"
                + machine_difference(r.get("machine"), res.get("machine"))
            )
    return "\n".join(lines)


def machine_difference(own: dict[str, Any] | None, header: dict[str, Any] | None) -> str:
    """What a section's own machine record (``ran["machine"]``) says that the header's does not:
    torch threads and package versions that differ (a section re-run alone, ``--only X --write``,
    keeps the header of the full run and names its own set-up here)."""
    if not own or not header:
        return ""
    diffs = []
    if own.get("torch_threads") != header.get("torch_threads"):
        diffs.append(f"torch threads {own.get('torch_threads')}")
    ours, theirs = own.get("versions", {}), header.get("versions", {})
    diffs += [f"{pkg} {v}" for pkg, v in ours.items() if theirs.get(pkg) != v]
    return f" (its own set-up: {', '.join(diffs)})" if diffs else ""


def recorded_machine(path: str) -> dict[str, Any] | None:
    """The header machine of an earlier ``results.json`` (None: no file)."""
    if not os.path.exists(path):
        return None
    with open(path) as fh:
        return json.load(fh).get("machine")


def recorded_sections(path: str, sections: Sequence[str]) -> dict[str, Any]:
    """The sections of an earlier ``results.json`` (those that predate per-section ``ran`` records get
    the file's date, wall time and load)."""
    if not os.path.exists(path):
        return {}
    with open(path) as fh:
        old = json.load(fh)
    load = old["machine"]["loadavg_start"]
    ran = {"date": old.get("date"), "wall_s": old.get("wall_s", 0.0), "loadavg_start": load,
           "loadavg_end": old.get("loadavg_end", load)}  # fmt: skip
    return {name: {"ran": ran, **old[name]} for name in sections if name in old}
