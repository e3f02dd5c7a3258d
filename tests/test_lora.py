"""Per-agent LoRA through the team seam (team/kinds.py): adapters on one frozen base held once, each
trained by its own optimizer, the disabled-adapter base as reference (no copy), adapters-only
checkpoints that resume bit-exact, PEFT export, threads on one base equal to serial."""

import copy
import os

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from test_strategy import fake_generate

import comlrl_lightning.team.team as team_mod
from comlrl_lightning import MAGRPO
from comlrl_lightning.callbacks import AgentCheckpoint
from comlrl_lightning.datamodules import LengthRatioDataModule
from comlrl_lightning.team.agents import AgentSpec, load_agent
from comlrl_lightning.team.kinds import LoraAdapter

pytest.importorskip("peft")

ADAPTER = {"r": 4, "lora_alpha": 8, "target_modules": "all-linear", "lora_dropout": 0.0}
TWO_ON_ONE_BASE = [
    {"model": "builtin:tiny-gpt2", "adapter": ADAPTER},
    {"model": "builtin:tiny-gpt2", "adapter": ADAPTER, "share_weights_with": 0},
]


def lora(agents=TWO_ON_ONE_BASE, **kw):
    kw.setdefault("learning_rate", 1e-2)
    return MAGRPO(agents=copy.deepcopy(agents), rollout={"num_generations": 2}, sampling={"max_new_tokens": 8},
                  **kw)  # fmt: skip


def dm(**kw):
    return LengthRatioDataModule(**{"batch_size": 2, "num_train": 8, **kw})


def unique_bytes(params):
    return sum({p.data_ptr(): p.numel() * p.element_size() for p in params}.values())


# ------------------------------------------------------------------ validation, before any model loads
@pytest.mark.parametrize(
    ("adapter", "message"),
    [
        ({"r": 0}, "agents[0].adapter.r: got 0, allowed: an integer >= 1"),
        ({"lora_alpha": -1}, "agents[0].adapter.lora_alpha: got -1, allowed: a number > 0"),
        ({"lora_dropout": 1.0}, "agents[0].adapter.lora_dropout: got 1.0, allowed: 0 <= lora_dropout < 1"),
        ({"target_modules": []}, "agents[0].adapter.target_modules: got [], allowed: 'all-linear'"),
        (
            {"rank": 8},
            "agents[0].adapter: unknown field 'rank'; did you mean 'r'? allowed: a peft.LoraConfig",
        ),
    ],
)
def test_a_bad_adapter_is_refused_naming_field_value_and_allowed_before_loading(
    monkeypatch, adapter, message
):
    monkeypatch.setattr("comlrl_lightning.team.kinds.load_agent", lambda spec: pytest.fail("loaded a model"))
    with pytest.raises(ValueError) as err:
        lora([{"model": "builtin:tiny-gpt2", "adapter": adapter}])
    assert message in str(err.value)


def test_an_adapter_cannot_share_the_weights_of_a_fully_trained_agent():
    with pytest.raises(ValueError, match=r"agents\[1\].share_weights_with: got 0, but agent 1 has adapter"):
        lora(
            [
                {"model": "builtin:tiny-gpt2"},
                {"model": "builtin:tiny-gpt2", "adapter": ADAPTER, "share_weights_with": 0},
            ]
        )
    with pytest.raises(ValueError, match=r"agents\[1\].model/dtype: .* allowed: the same model and dtype"):
        lora([TWO_ON_ONE_BASE[0], {**TWO_ON_ONE_BASE[1], "dtype": "bfloat16"}])


# ------------------------------------------------------------------ one base, own adapters, no reference copy
def test_two_adapters_hold_one_base_train_only_their_adapter_and_use_the_base_as_reference(trainer_factory):
    pl.seed_everything(0)
    model = lora(loss={"beta": 0.1})
    model.configure_model()
    a0, a1 = model.agents
    assert a0 is not a1 and all(isinstance(k, LoraAdapter) for k in model.team.kinds)
    base = [p for n, p in a0.named_parameters() if "lora_" not in n]
    adapters = [model.team.trainable_parameters(i) for i in range(2)]
    # the base is held once: the module's parameters are one base plus two adapters
    assert unique_bytes(model.parameters()) == unique_bytes(base) + sum(unique_bytes(a) for a in adapters)
    assert {id(p) for p in base} == {id(p) for n, p in a1.named_parameters() if "lora_" not in n}
    assert not {id(p) for p in adapters[0]} & {id(p) for p in adapters[1]}
    assert all(
        "lora_" in n for i in range(2) for n, p in model.agents[i].named_parameters() if p.requires_grad
    )
    assert len(model.reference_models) == 0  # beta > 0 and no reference copy
    before = [p.detach().clone() for p in base]
    ids = torch.randint(3, 200, (2, 7))
    base_logits = a0(input_ids=ids).logits.detach()
    trainer = trainer_factory(max_steps=4)
    trainer.fit(model, dm(formatters=["A {topic}:", "B {topic}:"]))
    assert trainer.global_step == 4
    opts = trainer.optimizers
    for i in range(2):  # each agent's own optimizer holds exactly its adapter
        assert [p for g in opts[i].param_groups for p in g["params"]] == adapters[i]
    assert all(torch.equal(a, b) for a, b in zip(before, base))  # the base never moved
    trained = model.agents[0](input_ids=ids).logits.detach()
    assert not torch.allclose(trained, base_logits)  # the adapter learned something
    ref = model.team.reference(0)(input_ids=ids).logits.detach()
    torch.testing.assert_close(ref, base_logits, rtol=0, atol=0)  # the reference: the adapter disabled
    assert len(model.reference_models) == 0


def test_two_adapters_on_one_base_in_threads_equal_serial(monkeypatch, trainer_factory):
    """The agent threads (concurrent_agents=True) run both agents' forward, reference (adapter disabled)
    and backward at the same time over the shared base: no adapter state is shared, so the result is
    the serial run's."""
    monkeypatch.setattr(team_mod, "generate", fake_generate)
    threads = []
    real = LoraAdapter.reference

    def spy(self, model, copy):
        import threading

        threads.append(threading.current_thread().name)
        return real(self, model, copy)

    monkeypatch.setattr(LoraAdapter, "reference", spy)
    results = []
    for concurrent in (False, True):
        pl.seed_everything(0)
        model = lora(loss={"beta": 0.5, "num_iterations": 2})
        model.concurrent_agents = concurrent
        trainer = trainer_factory(max_steps=8)  # two batches
        trainer.fit(model, dm(formatters=["A {topic}:", "B {topic}:"]))
        results.append([p.detach().clone() for p in model.parameters()])
    assert any(n.startswith("comlrl-agent") for n in threads)  # the threaded run really ran in threads
    assert not any(n.startswith("comlrl-agent") for n in threads[: len(threads) // 2])
    assert len(results[0]) == len(results[1])
    for serial, threaded in zip(*results):
        torch.testing.assert_close(threaded, serial, rtol=0, atol=1e-6)


# ------------------------------------------------------------------ checkpoints and export
def test_agent_checkpoint_exports_peft_folders_loadable_with_peft_model_from_pretrained(
    trainer_factory, tmp_path
):
    from peft import PeftModel

    pl.seed_everything(0)
    model = lora()
    trainer = trainer_factory(
        max_steps=4, callbacks=[AgentCheckpoint(dirpath=str(tmp_path), every_n_steps=0)]
    )
    trainer.fit(model, dm(formatters=["A {topic}:", "B {topic}:"]))
    folder = tmp_path / "step_2" / "agent_1"
    assert {"adapter_config.json", "adapter_model.safetensors"} <= set(os.listdir(folder))
    assert "model.safetensors" not in os.listdir(folder)  # adapters only, not the base
    base, _ = load_agent(AgentSpec(model="builtin:tiny-gpt2"))  # a fresh base with the run's base weights
    base.load_state_dict(model.team.kinds[0].pristine_base(0).state_dict())
    loaded = PeftModel.from_pretrained(base, str(folder))
    ids = torch.randint(3, 200, (2, 7))
    expected = model.agents[1](input_ids=ids).logits
    torch.testing.assert_close(loaded(input_ids=ids).logits, expected, rtol=0, atol=0)
    assert not torch.equal(model.agents[0](input_ids=ids).logits, expected)  # agent_1 is agent 1's adapter


class Preempted(Exception):
    pass


def run(
    trainer_factory, batches, ckpt_path=None, callbacks=(), crash_at=None, agents=TWO_ON_ONE_BASE, **kwargs
):
    class Crash(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if trainer.global_step == crash_at:
                raise Preempted

    pl.seed_everything(0)
    model = lora(agents)
    trainer = trainer_factory(max_steps=MAGRPO.max_steps_for(batches, 2), callbacks=[*callbacks, Crash()],
                              **kwargs)  # fmt: skip
    try:
        trainer.fit(model, dm(shuffle=True), ckpt_path=ckpt_path)
    except Preempted:
        pass
    return model


OPTIONS = [  # PEFT options beyond the four declared fields: DoRA, rsLoRA, a trained copy of ln_f, biases
    {"model": "builtin:tiny-gpt2", "adapter": {**ADAPTER, "use_dora": True, "use_rslora": True,
                                               "modules_to_save": ["ln_f"], "bias": "lora_only"}},
    {"model": "builtin:tiny-gpt2", "adapter": {**ADAPTER, "target_modules": ["c_attn"], "init_lora_weights": "gaussian"}},
]  # fmt: skip


@pytest.mark.parametrize("agents", [TWO_ON_ONE_BASE, OPTIONS], ids=["two_on_one_base", "peft_options"])
def test_an_adapters_only_checkpoint_resumes_bit_exact(trainer_factory, tmp_path, agents):
    saver = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=MAGRPO.max_steps_for(3, 2), save_top_k=-1)
    crashed = run(
        trainer_factory,
        6,
        callbacks=[saver],
        crash_at=MAGRPO.max_steps_for(3, 2) + 2,
        enable_checkpointing=True,
        agents=agents,
    )
    (ckpt,) = os.listdir(tmp_path)
    state = torch.load(tmp_path / ckpt, weights_only=False)["state_dict"]
    trained = {
        f"agents.{i}.{n}"
        for i in range(2)
        for n, p in crashed.agents[i].named_parameters()
        if p.requires_grad
    }
    assert (
        set(state) == trained
    )  # what the adapters train (with OPTIONS: ln_f's copy, biases), no frozen base
    assert any("lora_" in k for k in state)
    resumed = run(trainer_factory, 6, ckpt_path=str(tmp_path / ckpt), agents=agents)
    straight = run(trainer_factory, 6, agents=agents)
    for i in range(2):
        for (name, a), b in zip(resumed.agents[i].named_parameters(), straight.agents[i].parameters()):
            assert torch.equal(a, b), f"agent {i} {name}"


def test_lora_is_refused_under_fsdp2_before_any_model_loads():
    from comlrl_lightning.infra.sharded import ShardedTeamStrategy

    with pytest.raises(
        ValueError, match=r"agents\[0\].adapter: got .* with strategy 'fsdp2'; LoRA adapters are not"
    ):
        ShardedTeamStrategy.check_team(None, lora())  # the check reads only the module's specs and placement


def test_a_mixed_team_places_each_reference_copy_with_its_own_agent():
    from comlrl_lightning.infra.placement import plan_devices

    model = lora([TWO_ON_ONE_BASE[0], {"model": "builtin:tiny-gpt2"}], loss={"beta": 0.1})
    model.configure_model()
    assert model.team.reference_owners == [1] and len(model.reference_models) == 1
    plan = plan_devices(model, ["cpu", "meta"], root="cpu", num_gpus=0)
    assert plan.references == [torch.device("meta")]  # agent 1's device, not agent 0's
    assert model.team.reference(1) is model.reference_models[0]


def test_the_shipped_lora_yaml_trains_two_smollm2_adapters_on_one_base(tmp_path):
    """configs/coop_coordination_lora.yaml through the CLI, one batch: both agents' exported adapters
    moved off PEFT's initialisation (lora_B starts at zero), and each folder is adapters only."""
    import json

    from experiments import ROOT, experiment
    from safetensors.torch import load_file

    from comlrl_lightning.cli import main

    os.chdir(ROOT)
    saver = {"class_path": "comlrl_lightning.callbacks.AgentCheckpoint",
             "init_args": {"dirpath": str(tmp_path / "agents"), "every_n_steps": 0}}  # fmt: skip
    main(["fit", *experiment("coop_coordination_lora.yaml"), "--trainer.enable_progress_bar=false",
          f"--trainer.logger.init_args.save_dir={tmp_path}", "--trainer.max_steps=2", "--validate_before_fit=false",
          "--trainer.limit_val_batches=0", "--data.init_args.num_train=6", f"--trainer.callbacks+={json.dumps(saver)}"])  # fmt: skip
    for i in range(2):
        folder = tmp_path / "agents" / "step_1" / f"agent_{i}"
        config = json.loads((folder / "adapter_config.json").read_text())
        assert config["r"] == 8 and config["lora_alpha"] == 16
        weights = load_file(str(folder / "adapter_model.safetensors"))
        assert weights and all("lora_" in k for k in weights)
        assert any(v.abs().sum() > 0 for k, v in weights.items() if "lora_B" in k), f"agent {i} did not train"


def test_adapters_train_under_the_agent_parallel_strategy_and_share_one_device(trainer_factory):
    from comlrl_lightning import AgentParallelStrategy

    with pytest.raises(ValueError, match="agent_devices"):  # one base cannot sit on two devices
        lora(placement={"parallel_training": "mp", "agent_devices": ["cpu", "meta"]})
    model = lora(placement={"parallel_training": "mp", "agent_devices": ["cpu", "cpu"]})
    trainer = trainer_factory(max_steps=2, strategy=AgentParallelStrategy())
    trainer.fit(model, dm(formatters=["A {topic}:", "B {topic}:"]))
    assert trainer.global_step == 2 and trainer.strategy.plan.agents == [torch.device("cpu")] * 2


def test_ddp_asks_for_find_unused_parameters_with_two_adapters_on_one_base():
    from types import SimpleNamespace

    from lightning.pytorch.strategies import DDPStrategy

    model = lora()
    model._env = SimpleNamespace(num_agents=2)
    model._trainer = SimpleNamespace(strategy=DDPStrategy())  # its _ddp_kwargs: no find_unused_parameters
    with pytest.raises(ValueError, match="find_unused_parameters"):
        model.setup("fit")


def test_the_comparator_history_reads_a_saved_adapter_back_on_the_shared_base(tmp_path):
    # before the fix PolicyHistory.load read an adapter folder with AutoModelForCausalLM.from_pretrained,
    # which went to the hub for the base named in adapter_config.json (OSError offline, a builtin base)
    from comlrl_lightning.preference.comparator.history import PolicyHistory

    pl.seed_everything(0)
    model = lora()
    model.configure_model()
    with torch.no_grad():  # the adapters start at B = 0: make each agent differ from the base and each other
        for i, scale in enumerate((0.5, -0.3)):
            for p in model.team.trainable_parameters(i):
                p.add_(scale * torch.randn_like(p))
    history = PolicyHistory(str(tmp_path), model.team, k=1)
    history.save_round(0)
    ids = torch.randint(3, 200, (2, 7))
    live = [model.agents[i](input_ids=ids).logits.detach() for i in range(2)]
    loaded = [m for m, _ in history.load(1, [torch.device("cpu")] * 2)]
    assert sorted(os.listdir(tmp_path / "round_0")) == ["agent_0", "agent_1"]  # each agent's own adapter
    for i in range(2):
        torch.testing.assert_close(loaded[i](input_ids=ids).logits, live[i], rtol=0, atol=0)
    assert not torch.allclose(live[0], live[1])
    base_ids = {id(p) for n, p in model.agents[0].named_parameters() if "lora_" not in n}
    assert {id(p) for n, p in loaded[0].named_parameters() if "lora_" not in n} == base_ids  # held once
    with torch.no_grad():  # the live adapter moves on; the saved one does not follow
        for p in model.team.trainable_parameters(0):
            p.add_(1.0)
    torch.testing.assert_close(loaded[0](input_ids=ids).logits, live[0], rtol=0, atol=0)


def test_the_vllm_engine_is_refused_under_fsdp2_before_any_model_loads():
    from dataclasses import replace

    from comlrl_lightning import MAGRPO
    from comlrl_lightning.infra.sharded import ShardedTeamStrategy

    module = MAGRPO(agents="builtin:tiny-gpt2", num_agents=2)
    ShardedTeamStrategy.check_team(None, module)  # the HF backend shards
    # set after construction: building it with 'vllm' needs the vllm extra, which this venv lacks
    module.team.sampling[1] = replace(module.team.sampling[1], generation_backend="vllm")
    with pytest.raises(
        ValueError,
        match=r"sampling.generation_backend \(agent 1's, with agents\[1\].generation\): got 'vllm' with strategy 'fsdp2'.*allowed with fsdp2: \['auto', 'dynamic'",
    ):
        ShardedTeamStrategy.check_team(None, module)
    assert not module.team.agents  # nothing loaded
