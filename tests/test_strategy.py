"""AgentParallelStrategy and the team layouts it serves: device plans, placement, optimizer-state
placement after a resume, threaded agents, parameter sharing, heterogeneous teams, YAML forms.

No GPU here: a second device is played by ``meta`` (placement never copies *out* of meta, so a
detour through the wrong device fails loudly) and CUDA counts are mocked for the "auto" plans.
"""

import copy
from types import SimpleNamespace

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.accelerators import CPUAccelerator
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy, StrategyRegistry
from torch import nn

import comlrl_lightning.algorithms.base as base_mod
import comlrl_lightning.infra.strategy as strategy_mod
import comlrl_lightning.team.team as team_mod
from comlrl_lightning import MAGRPO, AgentParallelStrategy
from comlrl_lightning.core.generation import Generation, completion_mask_from_ids, tokenize_prompts
from comlrl_lightning.datamodules import LengthRatioDataModule
from comlrl_lightning.envs.base import Episode
from comlrl_lightning.infra.strategy import (
    DevicePlan,
    optimizer_state_to_param_devices,
    place_module,
    plan_devices,
    resolve_devices,
    visible_gpus,
)  # fmt: skip

CPU, META = torch.device("cpu"), torch.device("meta")


def cuda(i):
    return torch.device("cuda", i)


def tiny(num_agents=2, **kw):
    kw.setdefault("max_new_tokens", 8)
    kw.setdefault("learning_rate", 1e-2)
    return MAGRPO(
        agents=kw.pop("agents", "builtin:tiny-gpt2"),
        num_agents=num_agents,
        num_generations=kw.pop("k", 2),
        **kw,
    )


def dm(**kw):
    kw.setdefault("batch_size", 2)
    kw.setdefault("num_train", 8)
    return LengthRatioDataModule(**kw)


# ------------------------------------------------------------------ device plans
def test_auto_is_one_gpu_per_agent_then_round_robin_then_cpu():
    assert resolve_devices("auto", 3, num_gpus=4) == [cuda(0), cuda(1), cuda(2)]
    assert resolve_devices("auto", 3, num_gpus=2) == [cuda(0), cuda(1), cuda(0)]
    assert resolve_devices(None, 2, num_gpus=0) == [CPU, CPU]
    # agents sharing weights count once and sit with their owner
    assert resolve_devices("auto", 3, num_gpus=2, owners=[0, 0, 2]) == [cuda(0), cuda(0), cuda(1)]
    assert resolve_devices("cuda:1", 2, num_gpus=2) == [cuda(1), cuda(1)]
    assert resolve_devices(["cuda:1", "cpu"], 2, num_gpus=2, overrides=[None, "cuda:0"]) == [cuda(1), cuda(0)]


@pytest.mark.parametrize(
    "args,match",
    [
        (dict(spec=["cpu"], num=2, num_gpus=0), "agent_devices: got 1 devices for 2"),
        (dict(spec=["cpu", "gpu:x"], num=2, num_gpus=0), r"agent_devices\[1\]"),
        (
            dict(spec=["cuda:0", "cuda:2"], num=2, num_gpus=2),
            r"agent_devices\[1\]: cuda:2 requested, but 2 CUDA",
        ),
        (
            dict(spec=["cuda:0", "cuda:1"], num=2, num_gpus=2, owners=[0, 0]),
            r"agent_devices\[1\]: cuda:1 differs",
        ),
    ],
)
def test_bad_device_lists_fail_naming_the_entry(args, match):
    spec, num = args.pop("spec"), args.pop("num")
    with pytest.raises(ValueError, match=match):
        resolve_devices(spec, num, **args)


def test_strategy_auto_plan_with_mocked_gpus_and_agentspec_override(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    specs = [{"model": "builtin:tiny-gpt2"}, {"model": "builtin:tiny-gpt2", "device": "cuda:0"},
             {"model": "builtin:tiny-gpt2"}]  # fmt: skip
    model = MAGRPO(agents=specs, num_generations=2, beta=0.1)
    model.configure_model()  # loads on CPU; the plan below is only computed, nothing moves to CUDA
    strategy = AgentParallelStrategy()
    strategy.connect(model)
    assert strategy.root_device == cuda(0)  # no accelerator yet, CUDA "available"
    plan = strategy.resolve_plan()
    assert plan.agents == [cuda(0), cuda(0), cuda(0)]  # auto 0,1,0 -> agent 1 overridden to cuda:0
    assert plan.references == plan.agents
    assert strategy.device_for("critic", 2) == cuda(0) and strategy.device_for("reward", 0) == cuda(0)
    # without the override: one GPU per agent, round-robin
    model.specs[1].device = None
    assert strategy.resolve_plan().agents == [cuda(0), cuda(1), cuda(0)]
    # explicit lists, other kinds, a CPU accelerator
    strategy = AgentParallelStrategy(agent_devices=["cuda:1", "cpu", "cuda:0"], reference_devices="cpu",
                                     critic_devices=["cuda:1"], reward_devices=["cuda:1", "cpu"])  # fmt: skip
    strategy.connect(model)
    strategy.resolve_plan()
    assert [strategy.device_for("agent", i) for i in range(3)] == [cuda(1), CPU, cuda(0)]
    assert [strategy.device_for("reference", i) for i in range(3)] == [CPU] * 3
    assert (
        strategy.device_for("critic", 0) == cuda(1) and strategy.device_for("critic", 1) == CPU
    )  # agent 1's
    assert [strategy.device_for("reward", i) for i in range(2)] == [cuda(1), CPU]
    assert visible_gpus(CPUAccelerator()) == 0 and visible_gpus(None) == 2
    # no devices of its own: the strategy reads the module's agent_devices (MAGRPO init arg)
    other = tiny(3, agent_devices=["cuda:1", "cpu", "cpu"])
    other.configure_model()
    strategy = AgentParallelStrategy()
    strategy.connect(other)
    assert strategy.resolve_plan().agents == [cuda(1), CPU, CPU]
    strategy = AgentParallelStrategy()
    strategy.accelerator = CPUAccelerator()
    strategy.connect(model)
    assert strategy.root_device == CPU and strategy.resolve_plan().agents == [CPU] * 3


def test_module_device_args_are_validated_at_construction():
    with pytest.raises(ValueError, match=r"parallel_training: got 'ddp', allowed: \['none', 'mp'\]"):
        tiny(parallel_training="ddp")
    with pytest.raises(ValueError, match="agent_devices: parallel_training='mp' needs a list of 2"):
        tiny(parallel_training="mp")
    with pytest.raises(ValueError, match="agent_devices: parallel_training='mp' needs a list of 2"):
        tiny(parallel_training="mp", agent_devices=["cpu"])
    with pytest.raises(ValueError, match=r"agent_devices\[1\]: .* differs"):
        MAGRPO(agents=[{"model": "builtin:tiny-gpt2"}, {"model": "builtin:tiny-gpt2", "share_weights_with": 0}],
               parallel_training="mp", agent_devices=["cpu", "meta"])  # fmt: skip
    with pytest.raises(ValueError, match=r"agents\[0\].device"):
        MAGRPO(agents=[{"model": "builtin:tiny-gpt2", "device": "nope:0"}], num_generations=2)


def test_setup_refuses_mp_under_ddp_and_ddp_without_unused_parameter_detection():
    def setup_with(model, strategy):
        model.trainer = SimpleNamespace(strategy=strategy, datamodule=dm())
        model.setup("fit")

    with pytest.raises(ValueError, match="parallel_training='mp' runs the team in one process"):
        setup_with(
            tiny(parallel_training="mp", agent_devices=["cpu", "cpu"]),
            DDPStrategy(find_unused_parameters=True),
        )
    with pytest.raises(ValueError, match="ddp_find_unused_parameters_true"):
        setup_with(tiny(), DDPStrategy())
    setup_with(tiny(), DDPStrategy(find_unused_parameters=True))  # fine
    shared = [{"model": "builtin:tiny-gpt2"}, {"model": "builtin:tiny-gpt2", "share_weights_with": 0}]
    setup_with(MAGRPO(agents=shared, num_generations=2), DDPStrategy())  # one model: every parameter is used


# -------------------------------------------------------------------- placement
def test_place_module_moves_each_model_to_its_device_and_the_rest_to_root():
    model = tiny(beta=0.1)
    model.configure_model()
    model.head = nn.Linear(2, 2)  # a non-agent child
    plan = DevicePlan(root=META, agents=[CPU, META], references=[META, CPU])
    place_module(model, plan)
    assert {p.device for p in model.agents[0].parameters()} == {CPU}
    assert {p.device for p in model.agents[1].parameters()} == {META}
    assert {p.device for p in model.reference_models[0].parameters()} == {META}
    assert {p.device for p in model.reference_models[1].parameters()} == {CPU}
    assert model.head.weight.device == META and model.device == META


def test_model_to_device_never_routes_agents_through_the_root():
    # root = meta: had the strategy done module.to(root) first, the CPU agent could not come back
    # (a meta tensor has no data) and the next line would fail.
    model = tiny()
    model.configure_model()
    model.head = nn.Linear(2, 2)
    strategy = AgentParallelStrategy(agent_devices=["cpu", "meta"], root_device="meta")
    strategy.connect(model)
    strategy.model_to_device()
    assert (
        next(model.agents[0].parameters()).device == CPU
        and model.agents[0](torch.tensor([[5, 6]])).logits.isfinite().all()
    )
    assert next(model.agents[1].parameters()).device == META and model.head.weight.device == META


def test_shared_module_planned_on_two_devices_is_refused():
    model = MAGRPO(agents=[{"model": "builtin:tiny-gpt2"}, {"model": "builtin:tiny-gpt2", "share_weights_with": 0}],
                   num_generations=2)  # fmt: skip
    model.configure_model()
    with pytest.raises(ValueError, match=r"agents\[1\] is the same module as agents\[0\]"):
        place_module(model, DevicePlan(root=CPU, agents=[CPU, META]))
    assert plan_devices(model, ["meta", "meta"]).agents == [META, META]


def test_batches_of_episodes_are_left_alone_other_batches_go_to_root():
    strategy = AgentParallelStrategy(root_device="meta")
    batch = [Episode(0, {"x": torch.ones(2)})]
    assert strategy.batch_to_device(batch) is batch and batch[0].data["x"].device == CPU
    assert strategy.batch_to_device(torch.ones(2)).device == META


def test_tensor_init_context_sets_no_default_device():
    strategy = AgentParallelStrategy(root_device="meta")
    strategy.precision_plugin = pl.plugins.precision.Precision()
    with strategy.tensor_init_context():
        assert torch.empty(1).device == CPU
    with SingleDeviceStrategy(
        "meta", precision_plugin=pl.plugins.precision.Precision()
    ).tensor_init_context():
        assert torch.empty(1).device == META  # what the base class would have done


# ---------------------------------------------------------------- optimizer state
def _stepped_adam():
    a, b = nn.Parameter(torch.ones(3)), nn.Parameter(torch.ones(2))
    opt = torch.optim.AdamW([a, b], lr=0.1)
    (a.sum() + 2 * b.sum()).backward()
    opt.step()
    return opt, a, b


def test_optimizer_state_goes_to_each_params_device():
    opt, a, b = _stepped_adam()
    optimizer_state_to_param_devices(opt, device_of=lambda p: META if p is b else CPU)
    assert opt.state[a]["exp_avg"].device == CPU and opt.state[a]["exp_avg_sq"].device == CPU
    assert opt.state[b]["exp_avg"].device == META and opt.state[b]["exp_avg_sq"].device == META
    assert opt.state[b]["step"].device == CPU  # the step counter stays where torch.optim keeps it


def test_load_optimizer_state_dict_keeps_state_next_to_params_not_on_root():
    opt, a, b = _stepped_adam()
    saved = copy.deepcopy(opt.state_dict())
    expected = opt.state[a]["exp_avg"].clone()
    base = SingleDeviceStrategy("meta")
    base.optimizers = [opt]
    base.load_optimizer_state_dict({"optimizer_states": [saved]})
    assert opt.state[a]["exp_avg"].device == META  # Lightning's default: everything to the root device
    opt2, a2, _ = _stepped_adam()
    ours = AgentParallelStrategy(root_device="meta")
    ours.optimizers = [opt2]
    ours.load_optimizer_state_dict({"optimizer_states": [saved]})
    assert opt2.state[a2]["exp_avg"].device == CPU and torch.equal(opt2.state[a2]["exp_avg"], expected)


def test_fit_checkpoint_and_resume_under_agent_parallel(tmp_path):
    pl.seed_everything(0)
    ckpt = ModelCheckpoint(dirpath=tmp_path, save_last=True, every_n_train_steps=2)
    strategy = AgentParallelStrategy(agent_devices=["cpu", "cpu"])
    trainer = pl.Trainer(strategy=strategy, accelerator="cpu", max_steps=2, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0, callbacks=[ckpt])  # fmt: skip
    trainer.fit(tiny(beta=0.1), dm())
    assert strategy.plan.agents == [CPU, CPU] and strategy.plan.references == [CPU, CPU]
    model = tiny(beta=0.1)
    strategy2 = AgentParallelStrategy()
    trainer = pl.Trainer(strategy="agent_parallel", accelerator="cpu", max_steps=4, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0)  # fmt: skip
    assert isinstance(trainer.strategy, AgentParallelStrategy) and trainer.strategy is not strategy2
    trainer.fit(model, dm(), ckpt_path=str(tmp_path / "last.ckpt"))
    assert trainer.global_step == 4
    for opt in trainer.optimizers:
        state = next(iter(opt.state.values()))
        assert state["exp_avg"].abs().sum() > 0  # restored + stepped


def test_parallel_training_mp_under_a_plain_trainer_places_the_team_itself(monkeypatch):
    calls = []
    real = base_mod.place_module
    monkeypatch.setattr(base_mod, "place_module", lambda m, plan: (calls.append(plan.agents), real(m, plan)))
    trainer = pl.Trainer(accelerator="cpu", max_steps=2, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
                         enable_checkpointing=False)  # fmt: skip
    trainer.fit(tiny(parallel_training="mp", agent_devices=["cpu", "cpu"]), dm())
    assert calls and calls[0] == [CPU, CPU] and trainer.global_step == 2
    calls.clear()
    trainer = pl.Trainer(strategy=AgentParallelStrategy(), accelerator="cpu", max_steps=2, logger=False,
                         enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                         limit_val_batches=0, enable_checkpointing=False)  # fmt: skip
    trainer.fit(tiny(parallel_training="mp", agent_devices=["cpu", "cpu"]), dm())
    assert calls == []  # the strategy placed the team; the module did not do it a second time
    assert trainer.strategy.plan.agents == [CPU, CPU]


# --------------------------------------------------------------- threaded agents
def fake_generate(model, tokenizer, prompt_texts, num_generations, sampling, chat_rendered, do_sample=True):
    """Deterministic random completions (seeded by the prompts): thread order cannot change them."""
    ids, mask = tokenize_prompts(tokenizer, prompt_texts, chat_rendered)
    ids, mask = ids.repeat_interleave(num_generations, 0), mask.repeat_interleave(num_generations, 0)
    g = torch.Generator().manual_seed(sum(sum(map(ord, t)) for t in prompt_texts))
    comp = torch.randint(40, 120, (ids.shape[0], 6), generator=g)
    stop = torch.randint(1, 6, (ids.shape[0],), generator=g)
    comp[torch.arange(ids.shape[0]), stop] = tokenizer.eos_token_id
    cmask, clipped = completion_mask_from_ids(comp, tokenizer.eos_token_id)
    texts = tokenizer.batch_decode(
        comp * cmask + tokenizer.pad_token_id * (1 - cmask), skip_special_tokens=True
    )
    return Generation(ids, mask, comp, cmask, texts, clipped)


NO_DROPOUT = {
    "model": "builtin:tiny-gpt2",
    "model_kwargs": {"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0},
}
SHARED = [NO_DROPOUT, {"model": "builtin:tiny-gpt2", "share_weights_with": 0}, NO_DROPOUT]


@pytest.mark.parametrize("agents,num_iterations", [([NO_DROPOUT] * 2, 2), (SHARED, 1)])
def test_threaded_agents_match_serial_and_count_n_steps_per_batch(
    monkeypatch, trainer_factory, agents, num_iterations
):
    monkeypatch.setattr(team_mod, "generate", fake_generate)
    threads = []
    real_backward = MAGRPO._backward

    def spy(self, agent, batches):
        import threading

        threads.append(threading.current_thread().name)
        return real_backward(self, agent, batches)

    monkeypatch.setattr(MAGRPO, "_backward", spy)
    n = len(agents)  # dropout off: its draws from the global RNG would depend on thread order
    results = []
    for concurrent in (False, True):
        pl.seed_everything(0)
        model = tiny(n, num_iterations=num_iterations, agents=copy.deepcopy(agents))
        model.concurrent_agents = concurrent
        formatters = ["A {topic}:", "B {topic}:", "C {topic}:"][:n]
        trainer = trainer_factory(max_steps=n * num_iterations)  # one batch
        trainer.fit(model, dm(formatters=formatters))
        assert trainer.global_step == n * num_iterations  # N optimizer steps per batch and iteration
        results.append([p.detach().clone() for p in model.parameters()])
    assert any(name.startswith("comlrl-agent") for name in threads)  # the threaded path really ran
    assert not any(name.startswith("comlrl-agent") for name in threads[: len(threads) // 2])
    for serial, threaded in zip(*results):
        torch.testing.assert_close(threaded, serial, rtol=0, atol=1e-6)


# --------------------------------------------------------------- parameter sharing
def unique_param_bytes(module):
    return sum({p.data_ptr(): p.numel() * p.element_size() for p in module.parameters()}.values())


def test_shared_agents_hold_one_copy_of_the_weights_and_one_optimizer_state_each(trainer_factory):
    n = 3
    shared = MAGRPO(agents=[{"model": "builtin:tiny-gpt2"}] + [{"model": "builtin:tiny-gpt2", "share_weights_with": 0}] * (n - 1),
                    num_generations=2, max_new_tokens=8)  # fmt: skip
    separate = tiny(n)
    shared.configure_model()
    separate.configure_model()
    one = unique_param_bytes(shared.agents[0])
    assert unique_param_bytes(shared) == one  # 3 agents, 1 model
    assert unique_param_bytes(separate) == n * one
    assert all(shared.agents[i] is shared.agents[0] for i in range(n))
    trainer = trainer_factory(max_steps=n, enable_checkpointing=False)
    trainer.fit(shared, dm(formatters=["A {topic}:", "B {topic}:", "C {topic}:"]))
    opts = trainer.optimizers
    params0 = list(shared.agents[0].parameters())
    assert all([p for g in o.param_groups for p in g["params"]] == params0 for o in opts)  # same tensors
    p = params0[0]
    ptrs = {o.state[p]["exp_avg"].data_ptr() for o in opts}
    assert len(ptrs) == n  # each optimizer keeps its own moments
    assert not torch.equal(opts[0].state[p]["exp_avg"], opts[1].state[p]["exp_avg"])


class GradCheckAdamW(torch.optim.AdamW):
    """Before stepping, compares p.grad with the gradient of *this agent's* loss computed from scratch."""

    made: list = []
    stash: dict = {}
    module = None
    seen: list = []

    def __init__(self, params, **kw):
        super().__init__(params, **kw)
        self.agent = len(GradCheckAdamW.made)
        GradCheckAdamW.made.append(self)

    def step(self, closure=None):
        m = GradCheckAdamW.module
        model = m.agents[self.agent]
        batch = GradCheckAdamW.stash[self.agent]
        params = list(model.parameters())
        with torch.enable_grad():
            loss = 0.0
            for g, adv in batch.chunks:  # sequence_sum, on-policy: -mean_rows(A * sum_t log pi)
                logits = model(
                    input_ids=torch.cat([g.prompt_ids, g.completion_ids], 1),
                    attention_mask=torch.cat([g.prompt_mask, g.completion_mask], 1),
                    position_ids=(torch.cat([g.prompt_mask, g.completion_mask], 1).cumsum(-1) - 1).clamp(
                        min=0
                    ),
                ).logits
                c = g.completion_ids.shape[1]
                logp = torch.log_softmax(logits[:, -c - 1 : -1].float(), -1).gather(
                    -1, g.completion_ids[..., None]
                )[..., 0]
                loss = loss - (adv[:, None] * logp * g.completion_mask).sum() / batch.totals.num_rows
            expected = torch.autograd.grad(loss, params, allow_unused=True)
        diffs = [float((p.grad - e).abs().max()) for p, e in zip(params, expected) if e is not None]
        GradCheckAdamW.seen.append((self.agent, max(diffs), [p.grad.clone() for p in params[:1]]))
        return super().step(closure)


def test_each_shared_agent_steps_with_exactly_its_own_gradient(monkeypatch, trainer_factory):
    GradCheckAdamW.made, GradCheckAdamW.stash, GradCheckAdamW.seen = [], {}, []
    real = MAGRPO._prepare

    def stash(self, agent, turns):
        out = real(self, agent, turns)
        GradCheckAdamW.stash[agent] = out
        return out

    monkeypatch.setattr(MAGRPO, "_prepare", stash)
    model = MAGRPO(agents=[NO_DROPOUT, {"model": "builtin:tiny-gpt2", "share_weights_with": 0}],
                   num_generations=3, max_new_tokens=8, max_grad_norm=None, scale_advantages="none",
                   optimizer=lambda params: GradCheckAdamW(params, lr=1e-2))  # fmt: skip
    GradCheckAdamW.module = model
    trainer_factory(max_steps=4).fit(model, dm(batch_size=2))
    assert [a for a, _, _ in GradCheckAdamW.seen] == [0, 1, 0, 1]
    assert all(diff < 1e-5 for _, diff, _ in GradCheckAdamW.seen), GradCheckAdamW.seen
    # the two agents' gradients differ, so a summed (double-stepped) gradient would have been caught
    assert not torch.allclose(GradCheckAdamW.seen[0][2][0], GradCheckAdamW.seen[1][2][0])


def test_checkpoint_round_trip_keeps_the_sharing(tmp_path, trainer_factory):
    spec = [{"model": "builtin:tiny-gpt2"}, {"model": "builtin:tiny-gpt2", "share_weights_with": 0}]
    model = MAGRPO(agents=spec, num_generations=2, max_new_tokens=8, learning_rate=1e-2)
    ckpt = ModelCheckpoint(dirpath=tmp_path, save_last=True, every_n_train_steps=2)
    trainer_factory(max_steps=2, callbacks=[ckpt], enable_checkpointing=True).fit(model, dm())
    saved = {k: v.clone() for k, v in model.agents[0].state_dict().items()}
    sd = torch.load(tmp_path / "last.ckpt", weights_only=False)["state_dict"]
    assert any(k.startswith("agents.1.") for k in sd)  # duplicate keys of the shared module are written
    resumed = MAGRPO(agents=spec, num_generations=2, max_new_tokens=8, learning_rate=1e-2)
    loaded = {}

    class Grab(pl.Callback):
        def on_train_start(self, trainer, pl_module):
            loaded.update({k: v.clone() for k, v in pl_module.agents[0].state_dict().items()})
            loaded["same"] = pl_module.agents[0] is pl_module.agents[1]

    trainer = trainer_factory(max_steps=4, callbacks=[Grab()])
    trainer.fit(resumed, dm(), ckpt_path=str(tmp_path / "last.ckpt"))
    assert loaded.pop("same") is True and resumed.agents[0] is resumed.agents[1]
    assert all(torch.equal(loaded[k], saved[k]) for k in saved)
    assert trainer.global_step == 4


# --------------------------------------------------------------- heterogeneous team
def test_heterogeneous_team_each_agent_uses_its_own_tokenizer_and_template(monkeypatch, trainer_factory):
    calls = []
    real = team_mod.generate

    def spy(model, tokenizer, prompt_texts, *args, **kwargs):
        out = real(model, tokenizer, prompt_texts, *args, **kwargs)
        calls.append((model, tokenizer, list(prompt_texts), out))
        return out

    monkeypatch.setattr(team_mod, "generate", spy)
    model = MAGRPO(agents=["builtin:tiny-gpt2", "builtin:tiny-llama-gpt2tok"], num_generations=2, max_new_tokens=6,
                   learning_rate=1e-2)  # fmt: skip
    got = {}

    class Snap(pl.Callback):
        def on_train_start(self, trainer, pl_module):
            got["before"] = [[p.detach().clone() for p in a.parameters()] for a in pl_module.agents]

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            got.update(outputs)

    trainer_factory(max_steps=2, callbacks=[Snap()]).fit(model, dm())
    assert (
        type(model.agents[0]).__name__ == "GPT2LMHeadModel"
        and type(model.agents[1]).__name__ == "LlamaForCausalLM"
    )
    assert len(model.tokenizers[0]) == 384 and len(model.tokenizers[1]) == 50257
    by_model = {id(model.agents[i]): i for i in range(2)}
    for m, tok, texts, gen in calls:
        i = by_model[id(m)]
        assert tok is model.tokenizers[i]
        ids = gen.prompt_ids[::2]  # K=2 copies of each prompt
        mask = gen.prompt_mask[::2].bool()
        decoded = [tok.decode(row[mk]) for row, mk in zip(ids, mask)]
        if i == 0:
            assert int(gen.prompt_ids.max()) < 384 and all(t.startswith("Short note on") for t in texts)
            assert [d.replace("</s>", "") for d in decoded] == texts
        else:
            assert int(gen.prompt_ids.max()) >= 384  # BPE ids, not bytes
            assert all(
                t.startswith("### user:\nLonger note on") and t.endswith("### assistant:\n") for t in texts
            )
            assert decoded == texts
    assert got["prompts"][1][0].startswith("### user:") and not got["prompts"][0][0].startswith("###")
    for before, agent in zip(got["before"], model.agents):
        assert any(not torch.equal(b, p) for b, p in zip(before, agent.parameters()))


# ------------------------------------------------------------------- YAML forms
@pytest.mark.parametrize(
    "strategy",
    [
        "agent_parallel",
        {"class_path": "comlrl_lightning.infra.strategy.AgentParallelStrategy",
         "init_args": {"agent_devices": ["cpu", "cpu"], "reference_devices": ["cpu", "cpu"]}},
    ],
)  # fmt: skip
def test_cli_accepts_both_strategy_forms(tmp_path, monkeypatch, strategy):
    from conftest import tiny_cli_config

    from comlrl_lightning.cli import main

    seen = []
    real = AgentParallelStrategy.model_to_device

    def record(self):
        real(self)
        seen.append((self.agent_devices, self.reference_devices, self.plan.agents))

    monkeypatch.setattr(AgentParallelStrategy, "model_to_device", record)
    main(["fit", "--config", tiny_cli_config(tmp_path, strategy)])
    if isinstance(strategy, str):
        assert seen == [(None, None, [CPU, CPU])]
    else:
        assert seen == [(["cpu", "cpu"], ["cpu", "cpu"], [CPU, CPU])]


def test_registered_name():
    assert "agent_parallel" in StrategyRegistry
    assert isinstance(StrategyRegistry.get("agent_parallel"), AgentParallelStrategy)
    assert strategy_mod.KINDS == ("agent", "reference", "critic", "reward")


def test_mp_resume_mid_epoch_replaces_optimizer_state_after_it_is_loaded(tmp_path, monkeypatch):
    """Lightning loads optimizer state onto the root device after on_fit_start and skips
    on_train_epoch_start on the resumed epoch: the state must be re-placed before the first step."""
    events = []
    real_place, real_load = (
        base_mod.optimizer_state_to_param_devices,
        SingleDeviceStrategy.load_optimizer_state_dict,
    )
    monkeypatch.setattr(
        base_mod, "optimizer_state_to_param_devices", lambda opt: (events.append("place"), real_place(opt))
    )
    monkeypatch.setattr(SingleDeviceStrategy, "load_optimizer_state_dict",
                        lambda self, ckpt: (events.append("load"), real_load(self, ckpt)))  # fmt: skip
    real_step = MAGRPO.training_step
    monkeypatch.setattr(
        MAGRPO, "training_step", lambda self, b, i: (events.append("step"), real_step(self, b, i))[1]
    )

    trainer = pl.Trainer(accelerator="cpu", max_steps=2, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
                         callbacks=[ModelCheckpoint(dirpath=tmp_path, save_last=True, every_n_train_steps=2)])  # fmt: skip
    trainer.fit(tiny(parallel_training="mp", agent_devices=["cpu", "cpu"]), dm())  # 1 of 4 batches: mid-epoch
    events.clear()
    trainer = pl.Trainer(accelerator="cpu", max_steps=4, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
                         enable_checkpointing=False)  # fmt: skip
    trainer.fit(
        tiny(parallel_training="mp", agent_devices=["cpu", "cpu"]),
        dm(),
        ckpt_path=str(tmp_path / "last.ckpt"),
    )
    assert trainer.global_step == 4 and "load" in events
    after_load = events[len(events) - events[::-1].index("load") :]
    assert after_load.index("place") < after_load.index("step")  # both agents' optimizers re-placed first


def test_shared_agents_take_old_logprobs_from_the_policy_that_sampled(monkeypatch, trainer_factory):
    """num_iterations=2, agent 1 shares agent 0's weights: both no-grad passes (old log-probs) run
    before agent 0's first step, else agent 1's ratio would start at 1 against an updated policy."""
    from comlrl_lightning.team.agents import AgentSpec

    seen, real = [], MAGRPO._prepare
    monkeypatch.setattr(MAGRPO, "_prepare", lambda self, agent, turns: (seen.append((agent, self.global_step)),
                                                                       real(self, agent, turns))[1])  # fmt: skip
    model = tiny(agents=[AgentSpec("builtin:tiny-gpt2"), AgentSpec("builtin:tiny-gpt2", share_weights_with=0)],
                 num_iterations=2)  # fmt: skip
    trainer = trainer_factory(max_steps=4)  # one batch: 2 agents x 2 iterations
    trainer.fit(model, dm())
    assert seen == [(0, 0), (1, 0)] and trainer.global_step == 4
