"""Cooperation you can see: does a team of two SmolLM2-135M agents learn to cooperate, and is it the
*team* that learned (joint training beats agents trained apart, and the convention breaks when the
partners are changed)?

Tasks: the library's cooperation tasks (:mod:`comlrl_lightning.tasks.cooperation`, served by
``CooperationDataModule``): coordination, division of labour and dependence, each with a shared reward
that only the two answers together can earn; held-out problems use categories never seen in training.

Conditions, all with the same seeds and the same labelled samples per trained agent (``batches`` x
``batch_size`` episodes, each scored on its K joint actions, K + K^2 with two turns):

- ``joint``: MAGRPO, both agents trained together on the shared reward;
- ``apart0`` / ``apart1``: one agent trained alone against the frozen untrained partner
  (``AgentSpec.frozen``); ``apart``: the two agents trained apart, then paired (held-out only);
- ``shared``: one model plays both roles (``AgentSpec(share_weights_with=0)``);
- ``cross_play``: agent 0 of joint seed s with agent 1 of joint seed s+1 (mod the seeds);
- ``swap``: joint seed s with the roles swapped (agent 1's model answers agent 0's prompts and back);
- ``iac``, ``madpo``, ``credit``: the other joint trainers on the same shared reward and samples (IAC with
  a value head per agent; MADPO online, pairs from each batch's K joint actions; MAGRPO with
  counterfactual credit, difference rewards), run on the task :data:`SECOND_BLOCK` names.

Held-out team success is greedy, one answer per agent per problem, on every held-out problem. The order
in which the tasks run is fixed before any training by :data:`TASK_RULE` (``calibrate``, recorded in
:data:`CALIBRATION_FILE`). Trained weights live in a scratch folder only until the pairings that need
them are recorded.

    python benchmarks/cooperation/cooperation.py calibrate        # untrained held-out success per task
    python benchmarks/cooperation/cooperation.py run TASK [SEEDS [CONDITIONS]]  # the missing runs of one task (resumable)
    python benchmarks/cooperation/cooperation.py second-block     # the missing runs of SECOND_BLOCK
    python benchmarks/cooperation/cooperation_plan.py run         # the pre-registered plan's runs (cooperation_plan.toml)
    python benchmarks/run.py --only cooperation --write
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "lib"))
import bench_paths  # noqa: E402,F401 - every benchmarks/<concern>/ on sys.path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import lightning.pytorch as pl  # noqa: E402
import torch  # noqa: E402
from bench_lib import SMOLLM2  # noqa: E402
from learning_runs import append_run, recorded_runs  # noqa: E402
from learning_tasks import HeldOut, _quiet_trainer  # noqa: E402
from learning_train import run_record  # noqa: E402

from comlrl_lightning.tasks.cooperation import TASKS  # noqa: E402

RUNS_FILE = os.path.join(HERE, "cooperation_runs.jsonl")
"""One JSON line per finished training run or pairing (appended as each ends; runs resume from it)."""
CALIBRATION_FILE = os.path.join(HERE, "cooperation_calibration.json")
SCRATCH = os.path.join(tempfile.gettempdir(), "cooperation_weights")
"""Trained agents' weights (fp32 state dicts), per task, deleted once its pairings are recorded."""
CONFIG: dict[str, Any] = {  # fixed before any training; every condition and task uses it
    "batch_size": 2,  # episodes per batch
    "k": 4,  # num_generations: samples per agent per node
    "batches": 12,
    "eval_every": 6,  # batches between held-out evaluations (plus one before training)
    "learning_rate": 2e-5,
    "temperature": 1.0,  # sampling in training (held-out answers are greedy)
    "max_new_tokens": 3,  # one word is an answer
    "num_held_out": 50,
}
TASK_CONFIG: dict[str, dict[str, Any]] = {"dependence": {"k": 2}}
"""Per-task changes to :data:`CONFIG`, fixed before that task's first recorded run: the dependence task's
two turns make K + K^2 joint actions per episode (20 at K=4, five times a one-turn task's 4); at K=2 (6)
a run fits the shared machine. Every condition of a task uses the task's configuration."""
CRITIC_LEARNING_RATE = 1e-4
"""The ``iac`` condition's value heads (start from scratch): the learning benchmark's ``critic_learning_rate``."""
LORA_ADAPTER = {"r": 8, "lora_alpha": 16, "target_modules": "all-linear", "lora_dropout": 0.0}
"""The ``lora`` condition's adapters (``configs/coop_coordination_lora.yaml``'s)."""
SEEDS = (0, 1, 2)
TRAINED = ("joint", "apart0", "apart1", "shared")
JOINT_TRAINERS = ("iac", "madpo", "credit")
"""Joint training by the other trainers (IAC, online MADPO, MAGRPO with counterfactual credit)."""
SECOND_BLOCK = {
    "written": "2026-12-03, before any of these runs started",
    "division_seeds": (3, 4, 5),
    "division_conditions": ("joint", "apart0", "apart1"),
    "joint_trainers_task": "division",
    "joint_trainers_seeds": SEEDS,
    "dependence_conditions": ("shared",),
    "text": "The first block (seeds 0-2 of every task) left every joint - apart interval including 0; "
    "division's was the widest and the furthest from 0 (+27.3 pts [-3.3, +56.0]), its seeds spread "
    "(joint 66%, 62%, 18%). Fixed before any of the runs below started: division gets a second block "
    "of seeds 3, 4, 5 for joint, apart0 and apart1 (their apart, swap and cross-play pairings within "
    "the block, 3->4->5->3), under the same CONFIG, and the section reports all six seeds whatever "
    "they show, with the first block's difference beside it. No further block follows. IAC, online "
    "MADPO and counterfactual credit run on division, seeds 0-2, the same CONFIG and samples. "
    "Dependence gets its missing row, the shared model, seeds 0-2.",
}
"""The second block of runs, fixed (and committed) before any of them started."""
PAIRED = ("apart", "swap", "cross_play")
TASK_RULE = (
    "Before any training, each task's untrained greedy held-out team success (50 problems of held-out "
    "categories) is measured once (cooperation.py calibrate). Tasks whose success lies in [0.10, 0.60] run "
    "first, the one closest to 0.35 first (room to move both ways); a task outside that range runs after "
    "them, and the section says why it starts where it does. Division starts at 0 by construction: both "
    "agents start from the same weights and their prompts differ only in the role letter, so their greedy "
    "answers coincide (training samples at temperature 1, where they do not always)."
)


def config_for(task: str) -> dict[str, Any]:
    """:data:`CONFIG` with the task's :data:`TASK_CONFIG` changes."""
    return {**CONFIG, **TASK_CONFIG.get(task, {})}


def num_turns(task: str) -> int:
    return TASKS[task].num_turns


def labelled_per_batch(task: str, cfg: dict[str, Any]) -> int:
    """Joint actions the reward scores per batch: ``batch_size`` x (K, or K + K^2 with two turns)."""
    k = cfg["k"]
    return cfg["batch_size"] * sum(k ** (t + 1) for t in range(num_turns(task)))


def datamodule(task: str, cfg: dict[str, Any], seed: int) -> Any:
    from comlrl_lightning.datamodules import CooperationDataModule

    n = cfg["num_held_out"]
    return CooperationDataModule(
        task=task, num_held_out=n, batch_size=cfg["batch_size"], val_batch_size=n, seed=seed
    )


class CoopHeldOut(HeldOut):
    """:class:`learning_tasks.HeldOut` judging each path's last joint action, with the examples' problems;
    ``texts``: per agent, its first 6 greedy answers at its last turn (agent 0 of dependence: its message)."""

    def __init__(self, task: str, samples_per_batch: int) -> None:
        super().__init__(samples_per_batch, final=num_turns(task) > 1)
        self.problems: list[dict[str, Any]] = []

    def on_validation_batch_end(
        self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0
    ) -> None:
        fresh = not self.texts
        super().on_validation_batch_end(trainer, pl_module, outputs, batch, batch_idx, dataloader_idx)
        if fresh:
            turns = outputs["turns"]
            self.texts = [list(turns[0].generations[0].texts[:6]), list(turns[-1].generations[1].texts[:6])]
            self.problems = [dict(ep.data) for ep in batch[:6]]


def build(condition: str, task: str, cfg: dict[str, Any], chat_template: bool = False) -> Any:
    """The MAGRPO module of a training condition (:data:`TRAINED`) or of a pairing (two plain agents);
    ``chat_template``: the agents' (off in every recorded run; the communication pilot's candidate 4)."""
    from comlrl_lightning import MAGRPO, RolloutConfig, SamplingConfig
    from comlrl_lightning.team.agents import AgentSpec

    def agent(**kw: Any) -> AgentSpec:
        return AgentSpec(model=SMOLLM2, chat_template=chat_template, **kw)

    agents = {
        "apart0": [agent(), agent(frozen=True)],
        "apart1": [agent(frozen=True), agent()],
        "shared": [agent(), agent(share_weights_with=0)],
        # two LoRA adapters on one frozen base (benchmarks/learning/lora_learning.py)
        "lora": [agent(adapter=LORA_ADAPTER), agent(adapter=LORA_ADAPTER, share_weights_with=0)],
    }.get(condition, [agent(), agent()])
    sampling = SamplingConfig(max_new_tokens=cfg["max_new_tokens"], temperature=cfg["temperature"])
    if condition in JOINT_TRAINERS:
        return build_joint_trainer(condition, task, cfg, agents, sampling)
    return MAGRPO(
        agents=agents,
        rollout=RolloutConfig(num_generations=cfg["k"], num_turns=num_turns(task)),
        sampling=sampling,
        learning_rate=cfg["learning_rate"],
    )


def build_joint_trainer(condition: str, task: str, cfg: dict[str, Any], agents: list, sampling: Any) -> Any:
    """A :data:`JOINT_TRAINERS` module: the learning benchmark's settings of that trainer
    (``learning_train.build_module``) on this task's samples, ``cfg``'s learning rate."""
    from comlrl_lightning import (
        IAC,
        MADPO,
        MAGRPO,
        ActorCriticRolloutConfig,
        CriticConfig,
        DPOConfig,
        PreferenceConfig,
        RolloutConfig,
    )

    turns, lr = num_turns(task), cfg["learning_rate"]
    if condition == "iac":  # a value head on each agent's trunk (CoMLRL's default), its own learning rate
        rollout = ActorCriticRolloutConfig(num_generations=cfg["k"], num_turns=turns)
        critic = CriticConfig(critic_learning_rate=CRITIC_LEARNING_RATE)
        return IAC(agents=agents, rollout=rollout, sampling=sampling, critic=critic, learning_rate=lr)
    if condition == "madpo":  # online: each batch's K joint actions per episode -> winner/loser pairs
        if turns > 1:
            raise ValueError(f"madpo: one-turn tasks only; {task!r} has {turns} turns")
        pref = PreferenceConfig(preference_num_candidates=cfg["k"])
        return MADPO(agents=agents, preference=pref, dpo=DPOConfig(preference_mode="online"), sampling=sampling, learning_rate=lr)  # fmt: skip
    rollout = RolloutConfig(num_generations=cfg["k"], num_turns=turns, credit="counterfactual")
    return MAGRPO(agents=agents, rollout=rollout, sampling=sampling, learning_rate=lr)


def weights_path(task: str, condition: str, seed: int, agent: int) -> str:
    return os.path.join(SCRATCH, task, f"{condition}_{seed}_agent{agent}.pt")


def train(condition: str, task: str, seed: int, cfg: dict[str, Any] = CONFIG) -> dict[str, Any]:
    """One training run from the untrained team: held-out success before and every ``eval_every``
    batches; the trained agents' weights are kept in :data:`SCRATCH` for the pairings."""
    pl.seed_everything(seed, workers=True, verbose=False)
    module = build(condition, task, cfg)
    dm = datamodule(task, cfg, seed)
    rec = CoopHeldOut(task, labelled_per_batch(task, cfg))
    trained = [i for i, s in enumerate(module.specs) if not s.frozen]
    per_batch = module.steps_per_batch * len(trained) // module.num_agents  # a frozen agent never steps
    trainer = _quiet_trainer(
        callbacks=[rec],
        max_steps=cfg["batches"] * per_batch,  # Lightning counts every optimizer step
        val_check_interval=cfg["eval_every"],
        check_val_every_n_epoch=None,
        num_sanity_val_steps=0,
    )
    t0, load0 = time.time(), os.getloadavg()
    trainer.validate(module, datamodule=dm, verbose=False)
    trainer.fit(module, datamodule=dm)
    if condition in TRAINED and condition != "shared":  # no pairing reads the others
        os.makedirs(os.path.join(SCRATCH, task), exist_ok=True)
        for i in trained:
            torch.save(module.agents[i].state_dict(), weights_path(task, condition, seed, i))
    out = run_record(condition, task, seed, cfg, rec.samples_per_batch, rec, module, t0, load0)
    calls = labelled_per_batch(task, cfg)  # counterfactual credit also scores recombined joint actions
    if condition == "credit":
        calls = cfg["batch_size"] * module.rollout_config.reward_calls_per_episode(2)
    return {
        **out,
        "problems": rec.problems,
        "labelled_per_agent": cfg["batches"] * rec.samples_per_batch,
        "reward_calls_per_batch": calls,
    }


def pair(
    name: str, task: str, seed: int, sources: Sequence[str], cfg: dict[str, Any] = CONFIG
) -> dict[str, Any]:
    """Held-out success of two trained agents paired: ``sources[i]`` is the weights file agent i loads."""
    t0, load0 = time.time(), os.getloadavg()
    module = build("pair", task, cfg)
    module.team.load(with_reference=False)
    for i, path in enumerate(sources):
        module.agents[i].load_state_dict(torch.load(path, weights_only=True))
    rec = CoopHeldOut(task, 0)
    _quiet_trainer(callbacks=[rec]).validate(module, datamodule=datamodule(task, cfg, seed), verbose=False)
    out = run_record(name, task, seed, cfg, 0, rec, module, t0, load0)
    return {**out, "problems": rec.problems, "pair": [os.path.basename(p) for p in sources]}


def append(record: dict[str, Any], path: str = RUNS_FILE) -> None:
    append_run(record, path, f"[cooperation] {record['task']} {record['algorithm']} seed {record['seed']}")


def pairings(seeds: Sequence[int]) -> dict[tuple[str, int], list[tuple[str, int, int]]]:
    """Each pairing's sources ``(condition, seed, agent)`` for agents 0 and 1."""
    out: dict[tuple[str, int], list[tuple[str, int, int]]] = {}
    for j, s in enumerate(seeds):
        out["apart", s] = [("apart0", s, 0), ("apart1", s, 1)]
        out["swap", s] = [("joint", s, 1), ("joint", s, 0)]
        if len(seeds) > 1:
            out["cross_play", s] = [("joint", s, 0), ("joint", seeds[(j + 1) % len(seeds)], 1)]
    return out


def run_missing(
    task: str,
    seeds: Sequence[int] = SEEDS,
    cfg: dict[str, Any] | None = None,
    path: str = RUNS_FILE,
    conditions: Sequence[str] = TRAINED,
) -> None:
    """Every training run of ``conditions`` and every pairing of their agents of ``task`` not yet in
    ``path``, each appended as it ends; a pairing runs as soon as its agents' weights exist. Two
    processes may share a task with disjoint ``conditions`` (``joint`` in one, ``apart0,apart1`` in
    the other): each records only the pairings of its own runs. The task's scratch weights are deleted
    once every pairing is recorded. A pairing whose weights were lost (a new machine) retrains its sources."""
    cfg = config_for(task) if cfg is None else cfg
    done = {(r["algorithm"], r["seed"]) for r in recorded_runs(task, cfg, path)}
    todo = {k: v for k, v in pairings(seeds).items() if all(c in conditions for c, _, _ in v)}

    def ready(sources: list[tuple[str, int, int]]) -> bool:
        return all(os.path.exists(weights_path(task, c, s, i)) for c, s, i in sources)

    def do_pairs() -> None:
        for (name, s), sources in todo.items():
            if (name, s) not in done and ready(sources):
                append(pair(name, task, s, [weights_path(task, *src) for src in sources], cfg), path)
                done.add((name, s))

    def needed(condition: str, seed: int) -> list[tuple[str, int, int]]:
        """The weights this run provides to pairings not yet recorded."""
        return [
            src
            for key, srcs in todo.items()
            if key not in done
            for src in srcs
            if src[:2] == (condition, seed)
        ]

    unknown = [c for c in conditions if c not in TRAINED + JOINT_TRAINERS]
    if unknown:
        raise ValueError(f"conditions: {unknown} are not among {TRAINED + JOINT_TRAINERS}")
    for condition in [
        c for c in TRAINED + JOINT_TRAINERS if c in conditions
    ]:  # every seed's joint run (cross-play, swap) first
        for seed in seeds:
            if (condition, seed) not in done or not ready(needed(condition, seed)):
                r = train(condition, task, seed, cfg)
                if (condition, seed) not in done:
                    append(r, path)
                    done.add((condition, seed))
            do_pairs()
    do_pairs()
    recorded = {(r["algorithm"], r["seed"]) for r in recorded_runs(task, cfg, path)}
    if all(key in recorded for key in pairings(seeds)):
        shutil.rmtree(os.path.join(SCRATCH, task), ignore_errors=True)


def run_second_block() -> None:
    """The missing runs of :data:`SECOND_BLOCK` (resumable, as :func:`run_missing`)."""
    b = SECOND_BLOCK
    run_missing("division", b["division_seeds"], conditions=b["division_conditions"])
    run_missing(b["joint_trainers_task"], b["joint_trainers_seeds"], conditions=JOINT_TRAINERS)
    run_missing("dependence", SEEDS, conditions=b["dependence_conditions"])


def calibrate(cfg: dict[str, Any] = CONFIG) -> dict[str, Any]:
    """Untrained greedy held-out team success per task and the order :data:`TASK_RULE` gives."""
    out: dict[str, Any] = {"rule": TASK_RULE, "config": cfg, "tasks": {}}
    for task in TASKS:
        t0, load0 = time.time(), os.getloadavg()
        torch.manual_seed(0)
        rec = CoopHeldOut(task, 0)
        _quiet_trainer(callbacks=[rec]).validate(
            build("pair", task, cfg), datamodule=datamodule(task, cfg, 0), verbose=False
        )
        solved = rec.history[-1]["solved"]
        out["tasks"][task] = {"success": sum(solved) / len(solved), "n": len(solved), "wall_s": time.time() - t0,
                              "examples": rec.texts, "problems": rec.problems, "loadavg": [load0[0], os.getloadavg()[0]]}  # fmt: skip
        print(task, out["tasks"][task]["success"], flush=True)
    out["order"] = rule_order({t: v["success"] for t, v in out["tasks"].items()})
    return out


def rule_order(success: dict[str, float]) -> list[str]:
    """:data:`TASK_RULE`: tasks in [0.10, 0.60] by distance to 0.35, then the rest (in task order)."""
    inside = sorted((abs(v - 0.35), i, t) for i, (t, v) in enumerate(success.items()) if 0.10 <= v <= 0.60)
    first = [t for _, _, t in inside]
    return first + [t for t in success if t not in first]


if __name__ == "__main__":
    torch.set_num_threads(1)
    if sys.argv[1] == "calibrate":
        res = calibrate()
        with open(CALIBRATION_FILE, "w") as fh:
            json.dump(res, fh, indent=1)
        print("order:", res["order"])
    elif sys.argv[1] == "second-block":
        run_second_block()
    elif sys.argv[1] == "run":
        seeds = tuple(int(s) for s in sys.argv[3].split(",")) if len(sys.argv) > 3 else SEEDS
        conditions = tuple(sys.argv[4].split(",")) if len(sys.argv) > 4 else TRAINED
        run_missing(sys.argv[2], seeds, conditions=conditions)
