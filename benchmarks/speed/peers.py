"""The systems our module is timed against, each driven one batch at a time from :class:`bench_lib.Harness`.

- :class:`FloorPeer`: the bare work a step cannot avoid (tokenize, HF ``generate``, one forward and
  backward of the completions' log-probs, ``optimizer.step``), per agent, on our agents themselves.
- :class:`ComlrlPeer`: the reference library's ``MAGRPOTrainer`` (``comlrl==1.4.3``), own weights.
- :class:`TrlPeer`: TRL's ``GRPOTrainer`` running its own ``train()`` loop, paused after each step (greenlet),
  so that exactly one of its steps runs per batch of ours.
"""

from __future__ import annotations

import tempfile
import time
from typing import Any

import torch
from bench_lib import Peer, Setup, fresh_model, sync_weights

from comlrl_lightning.core.generation import (
    completion_mask_from_ids,
    has_chat_template,
    position_ids_from_mask,
    render_prompt,
    tokenize_prompts,
)
from comlrl_lightning.core.loss import selective_log_softmax
from comlrl_lightning.envs.toy import LengthRatioReward, TargetLengthReward


def _sync_device(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


class FloorPeer(Peer):
    """Minimal hand-written step, run on our agents' own model objects (same weights, same memory).

    Per agent: tokenize the batch's prompts, one ``generate`` over episodes × K, one forward with
    ``logits_to_keep`` + gather/logsumexp, backward, ``AdamW.step()``. No reward, no advantage
    bookkeeping, no clipping, no logging, no decode: a lower bound for any implementation. Its AdamW
    has ``lr=0``: the step does all of AdamW's arithmetic (moments, bias correction, decoupled decay)
    but leaves the weights as they are, so our training is unchanged; its gradients are dropped by
    our next ``zero_grad``.
    """

    name = "floor"

    def __init__(self, setup: Setup, tokenizer: Any) -> None:
        self.setup, self.tok = setup, tokenizer
        self.opts: dict[int, torch.optim.Optimizer] = {}
        self.lengths: list[float] = []
        self.generate_s: list[float] = []  # per step, all agents

    def step(self, batch: list[Any], module: Any) -> float:
        s = self.setup
        chat = has_chat_template(self.tok)
        prompts = [
            [render_prompt(self.tok, [module.env.observe(ep, i)], [], chat) for ep in batch]
            for i in range(s.num_agents)
        ]
        models = list(module.agents)
        for m in models:
            if id(m) not in self.opts:
                self.opts[id(m)] = torch.optim.AdamW(m.parameters(), lr=0.0)
        _sync_device(s.device)
        t0 = time.perf_counter()
        t_gen = 0.0
        for i in range(s.num_agents):
            tg = time.perf_counter()
            model, opt = models[i], self.opts[id(models[i])]
            opt.zero_grad(set_to_none=True)
            ids, mask = tokenize_prompts(self.tok, prompts[i], chat)
            ids, mask = (
                ids.repeat_interleave(s.k, 0).to(s.device),
                mask.repeat_interleave(s.k, 0).to(s.device),
            )
            model.eval()
            with torch.inference_mode():
                out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=s.temperature,
                                     top_p=s.top_p, top_k=s.top_k, max_new_tokens=s.max_new_tokens,
                                     pad_token_id=self.tok.pad_token_id, eos_token_id=model.generation_config.eos_token_id)  # fmt: skip
            model.train()
            comp = out[:, ids.shape[1] :].clone()
            _sync_device(s.device)
            t_gen += time.perf_counter() - tg
            cmask, _ = completion_mask_from_ids(comp, model.generation_config.eos_token_id)
            self.lengths.append(float(cmask.sum(-1).float().mean()))
            adv = torch.linspace(-1, 1, comp.shape[0], device=s.device)
            full, attn = torch.cat([ids, comp[:, :-1]], 1), torch.cat([mask, cmask[:, :-1]], 1)
            logits = model(input_ids=full, attention_mask=attn, position_ids=position_ids_from_mask(attn),
                           logits_to_keep=comp.shape[1], use_cache=False).logits  # fmt: skip
            if s.temperature != 1.0:
                logits = logits / s.temperature
            logps = selective_log_softmax(logits, comp)
            loss = -(logps * cmask * adv[:, None]).sum() / comp.shape[0]
            loss.backward()
            opt.step()
        _sync_device(s.device)
        self.generate_s.append(t_gen)
        return time.perf_counter() - t0


class ComlrlPeer(Peer):
    """``comlrl.MAGRPOTrainer`` on the same episodes, its own copy of the same initial weights.

    Per batch of ours (B episodes) it runs ``train()`` for one epoch over those B items: with
    ``rollout_buffer_size = train_batch_size = B`` that is B rollouts and one optimizer step per agent,
    exactly our update granularity. ``eval_interval=0``, no wandb, ``num_turns=1``,
    ``early_termination_threshold=None``, ``advantage_normalization=True``.
    """

    name = "comlrl"

    def __init__(self, setup: Setup, tokenizer: Any) -> None:
        from comlrl.trainers.reinforce.magrpo import MAGRPOConfig, MAGRPOTrainer

        self.setup = setup
        self.rewards: list[float] = []
        self.chars: list[float] = []
        pair = LengthRatioReward()
        target = TargetLengthReward(16)

        def reward(*completions: list[str]) -> list[float]:  # one completion list per agent
            texts = [c[0] for c in completions]
            r = pair.score(texts[0], texts[1]) if len(texts) == 2 else target([texts], [], 0)[0]
            self.rewards.append(r)
            self.chars.extend(len(t) for t in texts)
            return [r]

        if setup.num_agents > 2:
            raise ValueError("ComlrlPeer: the benchmark's CoMLRL reward covers 1 or 2 agents")
        args = MAGRPOConfig(
            num_train_epochs=1, agent_learning_rate=setup.lr, logging_steps=1, num_agents=setup.num_agents,
            num_generations=setup.k, max_new_tokens=setup.max_new_tokens, temperature=setup.temperature,
            top_p=setup.top_p, top_k=setup.top_k, num_turns=1, joint_mode="aligned",
            early_termination_threshold=None, eval_interval=0, rollout_buffer_size=setup.batch_size,
            train_batch_size=setup.batch_size, advantage_normalization=True, advantage_mode="mean",
            agent_devices=setup.device,
        )  # fmt: skip
        fmts = {1: ["Note on {topic}:"], 2: ["Short note on {topic}:", "Longer note on {topic}:"]}[
            setup.num_agents
        ]
        chat = has_chat_template(tokenizer)  # our module wraps prompts in the chat template when there is one

        def formatter(fmt: str) -> Any:
            return lambda item: render_prompt(tokenizer, [fmt.format(**item)], [], chat)

        self.trainer = MAGRPOTrainer(
            agents=[fresh_model(setup, i, tokenizer) for i in range(setup.num_agents)], num_agents=setup.num_agents,
            tokenizer=tokenizer, reward_func=reward, formatters=[formatter(f) for f in fmts],
            args=args, train_dataset=[],
        )  # fmt: skip
        self.trainer.verbose = False

    def step(self, batch: list[Any], module: Any) -> float:
        self.trainer.train_dataset = [dict(ep.data) for ep in batch]
        _sync_device(self.setup.device)
        t0 = time.perf_counter()
        self.trainer.train()
        _sync_device(self.setup.device)
        return time.perf_counter() - t0


class TrlPeer(Peer):
    """TRL ``GRPOTrainer`` (N=1): its real ``train()`` loop, paused after every step, one step per batch of ours.

    The loop runs in a greenlet on the main OS thread: a callback switches back to our loop at every
    ``on_step_end``, and :meth:`step` switches in for the next step. (A worker *thread* would give TRL
    its own OpenMP team, whose spinning workers slow the other system down on a 2-core machine.)

    Settings: ``beta=0``, ``num_iterations=1``, K = ``num_generations``, ``per_device_train_batch_size
    = B·K`` (B prompts per step, like ours), ``max_completion_length``, temperature/top_p/top_k equal,
    no vLLM, bf16/fp16 off, ``use_cpu`` on CPU, ``report_to="none"``, ``logging_steps=1``, constant LR,
    ``loss_type="dapo"`` (ours runs ``token_mean`` to match), ``shuffle_dataset=False`` (same order).
    Before each step our agent's weights are copied into TRL's model (untimed) so both sample from the
    same policy and generate equally long completions. The step time is one full iteration of TRL's
    loop (data, generation, scoring, loss, backward, optimizer, logging), like our Lightning loop time.
    """

    name = "trl"

    def __init__(self, setup: Setup, tokenizer: Any, prompts: list[str], num_steps: int) -> None:
        import datasets
        import greenlet
        from transformers import TrainerCallback
        from transformers.trainer_callback import PrinterCallback, ProgressCallback
        from trl import GRPOConfig, GRPOTrainer

        if setup.num_agents != 1:
            raise ValueError("TrlPeer: TRL trains one policy (num_agents=1)")
        self.setup = setup
        self.chars: list[float] = []
        self._closing = False
        target = TargetLengthReward(16)

        def length_reward(prompts: list[str], completions: list[str], **kw: Any) -> list[float]:
            self.chars.extend(len(c) for c in completions)
            return target([[c] for c in completions], [], 0)

        peer = self

        class Pause(TrainerCallback):
            def on_train_begin(self, args, state, control, **kw):
                peer._main.switch()

            def on_step_end(self, args, state, control, **kw):
                _sync_device(setup.device)
                peer._main.switch(time.perf_counter())
                if peer._closing:
                    control.should_training_stop = True

        self._dir = tempfile.TemporaryDirectory()
        args = GRPOConfig(
            output_dir=self._dir.name, use_cpu=not setup.device.startswith("cuda"), report_to="none",
            logging_steps=1, save_strategy="no", per_device_train_batch_size=setup.batch_size * setup.k,
            gradient_accumulation_steps=1, num_generations=setup.k, max_completion_length=setup.max_new_tokens,
            temperature=setup.temperature, top_p=setup.top_p, top_k=setup.top_k, learning_rate=setup.lr,
            lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.01, max_grad_norm=1.0, beta=0.0,
            num_iterations=1, loss_type="dapo", scale_rewards="group", use_vllm=False, bf16=False, fp16=False,
            max_steps=num_steps, shuffle_dataset=False, seed=setup.seed, dataloader_num_workers=0,
            disable_tqdm=True, log_completions=False, disable_dropout=True,
        )  # fmt: skip
        model = fresh_model(setup, 0, tokenizer)
        self.trainer = GRPOTrainer(model=model, reward_funcs=[length_reward], args=args,
                                   train_dataset=datasets.Dataset.from_list([{"prompt": p} for p in prompts]),
                                   processing_class=tokenizer, callbacks=[Pause()])  # fmt: skip
        for cb in (PrinterCallback, ProgressCallback):
            self.trainer.remove_callback(cb)
        self._main = greenlet.getcurrent()
        self._loop = greenlet.greenlet(self.trainer.train)
        self._loop.switch()  # runs set-up until on_train_begin

    def step(self, batch: list[Any], module: Any) -> float:
        if self._loop.dead:
            raise RuntimeError("TRL GRPOTrainer finished before our loop did (max_steps too small)")
        sync_weights(self.trainer.model, module.agents[0])
        _sync_device(self.setup.device)
        t0 = time.perf_counter()
        t_done = self._loop.switch()  # exceptions inside TRL propagate here
        return t_done - t0

    def close(self) -> None:
        self._closing = True
        if not self._loop.dead:
            self._loop.switch()
        self._dir.cleanup()
