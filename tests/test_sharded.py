"""The sharded strategy (``strategy: fsdp2``, FSDP2 over 2 gloo processes on CPU): refusals before
any model loads, equivalence with one process on the same global batch, kill -9 resume, and a
multi-node-shaped torchrun launch.

The fits run ``tests/sharded_fit.py`` in subprocesses (Lightning's launcher re-runs the calling
script for rank 1). Rollouts there are a seeded function of each prompt's text, so one process with
``batch_size=4`` and two ranks with ``batch_size=2`` each see the same joint actions.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import tiny_cli_config
from fp32_tolerance import UNIT_ROUNDOFF, sum_atol

from comlrl_lightning import IAC, MAGRPO, CriticSpec, ShardedTeamStrategy
from comlrl_lightning.datamodules import LengthRatioDataModule
from comlrl_lightning.infra.sharded import block_names

FIT = Path(__file__).with_name("sharded_fit.py")
STEPS, LR = 3, 1e-2
"""The equivalence fits: 3 batches, each a plain SGD step at lr 1e-2 per agent and critic."""
TOKENS = 4 * 2 * (32 + 6)
"""The longest sum in a gradient: 4 episodes x K=2 completions x (a prompt of at most 32 byte tokens,
``Longer note on <topic>:``, + 6 completion tokens), summed in one order by one process and in two halves
plus an all-reduce by two ranks."""
GRAD_ATOL = LR * sum_atol(1.0, TOKENS)
"""What one SGD step's update ``lr * g`` may differ by between the two runs (about 1.5e-7): each gradient
entry is a TOKENS-term sum whose terms' magnitudes are taken to add up to at most the clip bound
``max_grad_norm`` = 1 (the K samples' advantages cancel, so they may add up to more: sum_atol's margin
covers a few times that). SGD's step is linear in the gradient, so nothing amplifies that error; Adam's
``m / sqrt(v)`` turns rounding noise of a gradient whose true value is 0 (a key bias's) into a step of up to
``lr`` on any CPU, so no fp32 bound holds for it (its sharded state is pinned bit for bit by the kill -9
resume test below)."""


def atol(weight: torch.Tensor) -> float:
    """Per parameter after STEPS steps: STEPS x (GRAD_ATOL + the rounding of ``w - lr * g``, at most
    ``u * |w|`` in each run)."""
    return STEPS * (GRAD_ATOL + 2 * UNIT_ROUNDOFF * float(weight.abs().max()))


def _env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    for key in ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "RANK", "GROUP_RANK"):
        env.pop(key, None)
    return {**env, **extra}


def _fit(out: Path, *args: str, timeout: int = 240) -> dict[str, torch.Tensor]:
    out.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([sys.executable, str(FIT), str(out), *args], env=_env(), capture_output=True,
                          text=True, timeout=timeout, cwd=out)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    return torch.load(out / "weights.pt")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> tuple[float, str]:
    names = [k for k in a if not k.startswith("_")]
    assert names and sorted(names) == sorted(k for k in b if not k.startswith("_"))
    return max(((a[k] - b[k]).abs().max().item(), k) for k in names)


# ------------------------------------------------------------------ refusals (no process group, no model)
def _setup_with(model, strategy):
    model.trainer = SimpleNamespace(strategy=strategy, datamodule=LengthRatioDataModule(num_train=4))
    model.setup("fit")


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(parallel_training="mp", agent_devices=["cpu", "cpu"]), r"parallel_training: got 'mp' with strategy 'fsdp2'"),
        (dict(agent_devices=["cpu", "cpu"]), r"agent_devices: got \['cpu', 'cpu'\] with strategy 'fsdp2'"),
        (dict(agents=[{"model": "builtin:tiny-gpt2", "device": "cpu"}] * 2), r"agents\[0\].device: got 'cpu'"),
        (dict(agents=[{"model": "builtin:tiny-gpt2"}, {"model": "builtin:tiny-gpt2", "share_weights_with": 0}]),
         r"agents\[1\].share_weights_with: got 0 with strategy 'fsdp2'"),
    ],
)  # fmt: skip
def test_setup_refuses_what_sharding_cannot_serve_before_any_model_loads(kwargs, match):
    model = MAGRPO(**{"agents": "builtin:tiny-gpt2", "num_agents": 2, "num_generations": 2, **kwargs})
    with pytest.raises(ValueError, match=match):
        _setup_with(model, ShardedTeamStrategy())
    assert len(model.agents) == 0


def test_a_value_head_on_an_agents_trunk_is_refused_before_any_model_loads():
    model = IAC(agents="builtin:tiny-gpt2", num_agents=2, critics=CriticSpec(model=None))
    with pytest.raises(ValueError, match=r"critics\[0\].model: got None \(a value head on agent 0's trunk\)"):
        _setup_with(model, ShardedTeamStrategy())
    assert len(model.agents) == 0 and len(model.critics) == 0


def test_threads_and_bad_mixed_precision_are_refused():
    model = MAGRPO(agents="builtin:tiny-gpt2", num_agents=2, num_generations=2)
    model.concurrent_agents = True
    with pytest.raises(ValueError, match="concurrent_agents: got True with strategy 'fsdp2'"):
        _setup_with(model, ShardedTeamStrategy())
    with pytest.raises(ValueError, match=r"mixed_precision: got 'fp8', allowed: \['auto', 'bf16', 'none'\]"):
        ShardedTeamStrategy(mixed_precision="fp8")


def test_mixed_precision_policy_follows_the_trainer_precision():
    from lightning.pytorch.plugins.precision import MixedPrecision, Precision

    strategy = ShardedTeamStrategy()
    strategy.precision_plugin = MixedPrecision("bf16-mixed", "cpu")
    policy = strategy.mp_policy()
    assert (policy.param_dtype, policy.reduce_dtype) == (torch.bfloat16, torch.float32)
    strategy.precision_plugin = Precision()  # 32-true
    assert strategy.mp_policy() is None
    assert ShardedTeamStrategy(mixed_precision="bf16").mp_policy().param_dtype == torch.bfloat16
    off = ShardedTeamStrategy(mixed_precision="none")
    off.precision_plugin = MixedPrecision("bf16-mixed", "cpu")
    assert off.mp_policy() is None


def test_registered_name_and_blocks_come_from_no_split_modules():
    import lightning.pytorch as pl

    trainer = pl.Trainer(strategy="fsdp2", accelerator="cpu", devices=1, logger=False)
    assert isinstance(trainer.strategy, ShardedTeamStrategy)
    model = MAGRPO(agents="builtin:tiny-gpt2", num_agents=1, num_generations=2)
    model.configure_model()
    assert block_names(model.agents[0]) == {"GPT2Block"}
    assert block_names(torch.nn.Linear(2, 2)) == set()


# ------------------------------------------------------------------ fits (2 gloo processes)
@pytest.mark.slow
@pytest.mark.parametrize("algo", ["magrpo", "iac"])
def test_two_rank_fit_equals_one_process(tmp_path, algo):
    """3 batches of 4 episodes, plain SGD: one process (batch_size 4, no sharding) against two ranks
    (batch_size 2 each, every agent, reference and critic sharded). Every parameter agrees within atol(),
    derived from fp32 rounding alone; one process on half the batch (what a rank sees alone) lands
    hundreds of times farther away, so a rank that skipped the all-reduce would fail."""
    args = ("--algo", algo, "--optimizer", "sgd")
    one = _fit(tmp_path / "one", *args, "--strategy", "auto", "--devices", "1", "--batch-size", "4")
    two = _fit(tmp_path / "two", *args, "--strategy", "fsdp2", "--devices", "2", "--batch-size", "2")
    half = _fit(tmp_path / "half", *args, "--strategy", "auto", "--devices", "1", "--batch-size", "2")
    assert int(two["_world_size"]) == 2 and int(one["_global_step"]) == int(two["_global_step"])
    names = [k for k in one if not k.startswith("_")]
    worst = max(((one[k] - two[k]).abs().max().item() / atol(one[k]), k) for k in names)
    assert worst[0] <= 1, f"{worst[1]}: {worst[0]:.3g} x its tolerance"
    assert max((one[k] - half[k]).abs().max().item() / atol(one[k]) for k in names) > 100


# ------------------------------------------------------------------ checkpoints
def _ckpt(out: Path, step: int) -> Path:
    (found,) = (out / "ckpt").glob(f"*step={step}.ckpt")
    return found


@pytest.mark.slow
def test_kill_9_mid_fit_then_resume_is_bit_exact_and_checkpoints_change_world_size(tmp_path):
    """Two ranks, real sampled rollouts and a validation batch at the epoch end, 4 batches per epoch,
    a sharded checkpoint every 2 batches. Run A trains 6 batches. Run B is SIGKILLed (both ranks)
    after batch 3, then resumes from its batch-2 checkpoint to batch 6: every parameter equals A's
    bit for bit. A's HF export equals its gathered weights. A's epoch-end checkpoint (batch 4) resumes
    under one process; its mid-epoch one (batch 2) is refused there, naming both world sizes."""
    common = ["--real-generate", "--val", "--max-batches", "6", "--ckpt-every", "2"]
    a = _fit(tmp_path / "a", *common, "--export")
    out_b = tmp_path / "b"
    out_b.mkdir()
    killed = subprocess.run([sys.executable, str(FIT), str(out_b), *common, "--die-after", "3"], env=_env(),
                            capture_output=True, text=True, timeout=240, cwd=out_b, start_new_session=True)  # fmt: skip
    assert killed.returncode == -9 and not (out_b / "weights.pt").exists(), killed.stderr[-2000:]
    assert sorted(p.name for p in (out_b / "ckpt").iterdir()) == ["epoch=0-step=4.ckpt"]  # batch 2 only
    b = _fit(out_b, *common, "--resume", str(_ckpt(out_b, 4)))
    assert int(a["_global_step"]) == int(b["_global_step"]) == 12
    names = [k for k in a if not k.startswith("_")]
    assert names and all(torch.equal(a[k], b[k]) for k in names), [
        k for k in names if not torch.equal(a[k], b[k])
    ]
    # the full-state export of each agent is a Hugging Face folder holding the trained weights
    from transformers import AutoModelForCausalLM

    for i in range(2):
        hf = AutoModelForCausalLM.from_pretrained(tmp_path / "a" / "agents" / "step_6" / f"agent_{i}")
        assert all(torch.equal(p, a[f"agent{i}.{n}"]) for n, p in hf.named_parameters())
    # world size 2 -> 1: the epoch-end checkpoint loads (DCP reshards), the mid-epoch one is refused
    one = _fit(tmp_path / "one", *common, "--devices", "1", "--resume", str(_ckpt(tmp_path / "a", 8)))
    assert int(one["_world_size"]) == 1 and int(one["_global_step"]) == 12
    proc = subprocess.run([sys.executable, str(FIT), str(tmp_path / "one"), *common, "--devices", "1", "--resume",
                           str(_ckpt(tmp_path / "a", 4))], env=_env(), capture_output=True, text=True, timeout=240)  # fmt: skip
    assert proc.returncode != 0
    assert "written mid-epoch under world_size=2, resumed under world_size=1" in proc.stderr


# ------------------------------------------------------------------ multi-node-shaped launch
@pytest.mark.slow
def test_torchrun_two_nodes_of_one_process_runs_the_same_fit(tmp_path):
    """``torchrun --nnodes 2 --nproc_per_node 1`` twice on one machine (loopback, static rendezvous):
    Lightning reads the torchelastic environment (num_nodes=2, devices=1) and the fit equals the
    two-rank fit that Lightning's own launcher runs."""
    port = _free_port()
    out = tmp_path / "nodes"
    out.mkdir()
    # each node's output goes to a file, not a pipe (node 1's pipe was read only after node 0 exited), so a
    # failure or timeout shows where both nodes stood; a timeout kills each node's process group
    logs = [tmp_path / f"node{node}.log" for node in range(2)]
    handles = [log.open("w") for log in logs]
    procs = [
        subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "1",
                          "--node_rank", str(node), "--master_addr", "127.0.0.1", "--master_port", str(port),
                          str(FIT), str(out), "--devices", "1", "--num-nodes", "2"],
                         env=_env(), stdout=handle, stderr=subprocess.STDOUT, text=True, cwd=out,
                         start_new_session=True)  # its own process group: a timeout kills the worker too
        for node, handle in enumerate(handles)
    ]  # fmt: skip
    # 420 s: past torchelastic's 300 s exit barrier. Node 0's agent hosts the rendezvous store, and the
    # barrier can miss node 1's arrival (pytorch/pytorch#69520, open): node 0 then waits the full 300 s,
    # logs "Error waiting on exit barrier" and exits 0: the likely cause of the one hang seen here, in
    # CI, at 240 s after a finished fit (not confirmed). The race costs time, not the result checked.
    try:
        for p, log in zip(procs, logs):
            p.wait(timeout=420)
            assert p.returncode == 0, log.read_text()[-3000:]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        for handle in handles:
            handle.close()
    nodes = torch.load(out / "weights.pt")
    two = _fit(tmp_path / "two")
    assert int(nodes["_world_size"]) == 2
    diff, where = _max_diff(nodes, two)
    assert diff == 0.0, f"{where}: {diff}"


# ------------------------------------------------------------------ YAML forms (one process, world size 1)
def test_cli_refuses_a_mid_epoch_checkpoint_of_another_world_size_before_any_model_loads(
    tmp_path, monkeypatch
):
    import comlrl_lightning.team.kinds as kinds_mod
    from comlrl_lightning.cli import main

    monkeypatch.setattr(
        kinds_mod, "load_agent", lambda *a: (_ for _ in ()).throw(AssertionError("a model loaded"))
    )
    ckpt = tmp_path / "epoch=0-step=4.ckpt"
    ckpt.mkdir()
    (ckpt / "sharding.json").write_text('{"world_size": 2, "mid_epoch": true}')
    with pytest.raises(ValueError, match="written mid-epoch under world_size=2, resumed under world_size=1"):
        main(["fit", "--config", tiny_cli_config(tmp_path, "fsdp2", devices=1), "--ckpt_path", str(ckpt)])


@pytest.mark.parametrize(
    "strategy",
    ["fsdp2", {"class_path": "comlrl_lightning.infra.sharded.ShardedTeamStrategy",
               "init_args": {"reshard_after_forward": False}}],
)  # fmt: skip
def test_cli_accepts_both_strategy_forms(tmp_path, monkeypatch, strategy):
    """``trainer.strategy: fsdp2`` and the class_path form build the strategy from YAML; every agent
    and reference model is sharded (a 1-rank mesh here), with the configured reshard setting."""
    from comlrl_lightning.cli import main

    for key in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "LOCAL_RANK", "NODE_RANK", "RANK"):
        monkeypatch.delenv(key, raising=False)  # Lightning sets them for its process group; undone after
    seen = []
    real = ShardedTeamStrategy.shard_team

    def record(self, module, rollout_context=None):
        real(self, module, rollout_context)
        models = [*module.agents, *module.reference_models]
        seen.append(
            (
                self.reshard_after_forward,
                all(type(p).__name__ == "DTensor" for m in models for p in m.parameters()),
            )
        )

    monkeypatch.setattr(ShardedTeamStrategy, "shard_team", record)
    main(["fit", "--config", tiny_cli_config(tmp_path, strategy, devices=1)])
    assert seen == [(isinstance(strategy, str), True)]


# ------------------------------------------------------------------ the rollout gather (a 1-rank gloo group)
def test_gathered_holds_full_weights_inside_and_leaves_trainable_shards_even_under_inference_mode(
    monkeypatch,
):
    """Inside ``gathered`` the agent's parameters are plain full tensors through several forwards;
    after it they are shards again, and a training forward/backward still works although the
    gather ran inside ``inference_mode`` (as in Lightning's validation loop): FSDP2 would otherwise
    keep inference tensors in buffers that training reuses."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    from comlrl_lightning.infra.sharded import gathered, shard_model
    from comlrl_lightning.team.agents import AgentSpec, load_agent

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(_free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        model, _ = load_agent(AgentSpec(model="builtin:tiny-gpt2"))
        shard_model(model, init_device_mesh("cpu", (1,)), None, True)
        ids = torch.tensor([[5, 6, 7, 8]])
        with torch.inference_mode(), gathered(model):
            for _ in range(2):
                model(ids)
                assert not any(isinstance(p, DTensor) for p in model.parameters())
        assert all(isinstance(p, DTensor) for p in model.parameters())
        model(ids, labels=ids).loss.backward()
        assert all(p.grad is not None for p in model.parameters())
    finally:
        dist.destroy_process_group()
