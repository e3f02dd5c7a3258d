"""InterruptCheckpoint's phases: outside any training batch (MARLHF's phase 1) a SIGTERM abandons the work
at once, saving nothing while the pairs are being built (even with a hanging reward) and a checkpoint
that resumes bit-exact once they are; inside a batch's updates it keeps no copy of the agents (the batch
finishes, then saves) and a second signal stops at once, saving nothing."""

import gc
import os
import signal
import time

import lightning.pytorch as pl
import pytest
import torch
from test_faults import SignalAt, run
from test_marlhf import assert_same, data, marlhf, params, separable_pairs

from comlrl_lightning import MAGRPO
from comlrl_lightning.algorithms import joint_reward_model
from comlrl_lightning.callbacks import InterruptCheckpoint
from comlrl_lightning.envs.base import DecPOMDP
from comlrl_lightning.preference.pairs import write_pairs


def fit(trainer_factory, module, batches, datamodule=None, ckpt_path=None, **kw):
    trainer = trainer_factory(max_steps=MAGRPO.max_steps_for(batches, 2), **kw)
    trainer.fit(module, datamodule or data(), ckpt_path=ckpt_path)
    return trainer


def test_sigterm_while_pairs_are_built_with_a_hanging_reward_stops_at_once_saving_nothing(
    trainer_factory, tmp_path, lightning_log
):
    calls = []

    def hanging_reward(joint_actions, episodes, turn):
        calls.append(len(joint_actions))
        os.kill(os.getpid(), signal.SIGTERM)  # the signal lands while the reward hangs
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            time.sleep(0.05)
        raise AssertionError("the SIGTERM did not stop the pair building")

    dm = data()
    dm.env = DecPOMDP(dm.env.formatters, hanging_reward)
    pl.seed_everything(0)
    module = marlhf(tmp_path, epochs=1)  # pairs built from rollouts scored by the env's reward
    stop = InterruptCheckpoint(dirpath=str(tmp_path / "ckpt"))
    with pytest.raises(SystemExit) as info:
        fit(trainer_factory, module, 1, datamodule=dm, callbacks=[stop])
    assert info.value.code == 128 + signal.SIGTERM
    assert calls == [calls[0]]  # the first reward call was abandoned, no other started
    assert not os.path.exists(stop.ckpt_path)  # nothing trained: nothing saved
    assert not os.path.exists(tmp_path / "rm" / "phase1_state.pt")
    assert (
        "Interrupted in MARLHF phase 1 (preference pairs, reward-model epochs): nothing trained"
        in lightning_log.text
    )


def test_sigterm_inside_a_reward_model_epoch_saves_a_checkpoint_that_resumes_bit_exact(
    trainer_factory, tmp_path, monkeypatch
):
    path = tmp_path / "pairs.jsonl"
    write_pairs(path, separable_pairs(12))
    scored = joint_reward_model.sequence_logits
    calls = []

    def term_in_epoch_one(*args, **kwargs):  # a reward-model forward in the middle of epoch 1
        calls.append(1)
        if len(calls) == 14:
            os.kill(os.getpid(), signal.SIGTERM)
        return scored(*args, **kwargs)

    pl.seed_everything(0)
    a = marlhf(tmp_path, epochs=3, pairs_path=str(path), rm_dir="rm_a")
    epochs_done = []
    a.after_reward_epoch = epochs_done.append
    stop = InterruptCheckpoint(dirpath=str(tmp_path / "ckpt"))
    monkeypatch.setattr(joint_reward_model, "sequence_logits", term_in_epoch_one)
    with pytest.raises(SystemExit) as info:
        fit(trainer_factory, a, 2, callbacks=[stop])
    monkeypatch.undo()
    assert info.value.code == 128 + signal.SIGTERM
    assert epochs_done == [0] and len(calls) == 14  # abandoned inside epoch 1, at once
    assert torch.load(tmp_path / "rm_a" / "phase1_state.pt", weights_only=False)["epoch"] == 1
    assert os.path.exists(stop.ckpt_path)
    pl.seed_everything(0)
    resumed = marlhf(tmp_path, epochs=3, pairs_path=str(path), rm_dir="rm_a")
    fit(trainer_factory, resumed, 2, ckpt_path=stop.ckpt_path)
    pl.seed_everything(0)
    straight = marlhf(tmp_path, epochs=3, pairs_path=str(path), rm_dir="rm_c")
    fit(trainer_factory, straight, 2)
    assert resumed.reward_info["history"] == straight.reward_info["history"]
    assert_same(params(resumed.reward_models), params(straight.reward_models), "reward model")
    assert_same(params(resumed.agents), params(straight.agents), "agents")


def test_sigterm_before_training_starts_stops_before_phase_1(trainer_factory, tmp_path, lightning_log):
    class TermInSanityCheck(pl.Callback):  # a signal Lightning's own handler notes before on_train_start
        def on_sanity_check_start(self, trainer, pl_module):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)  # the handler runs
            assert trainer.received_sigterm

    pl.seed_everything(0)
    stop = InterruptCheckpoint(dirpath=str(tmp_path / "ckpt"))
    with pytest.raises(SystemExit) as info:
        fit(trainer_factory, marlhf(tmp_path, epochs=1), 1, callbacks=[TermInSanityCheck(), stop],
            num_sanity_val_steps=1, limit_val_batches=1)  # fmt: skip
    assert info.value.code == 128 + signal.SIGTERM
    assert not os.path.exists(stop.ckpt_path) and not os.path.exists(tmp_path / "rm" / "phase1_state.pt")
    assert "stopping before MARLHF phase 1" in lightning_log.text


def live_tensor_bytes():
    """Bytes of every distinct tensor storage alive in this process (tensors without a real storage that
    earlier tests left for the collector, e.g. fake or functional ones, are not counted)."""
    gc.collect()
    seen, total = set(), 0
    for obj in gc.get_objects():
        if isinstance(obj, torch.Tensor) and obj.device.type == "cpu":
            try:
                storage = obj.untyped_storage()
                ptr = storage.data_ptr()
            except (RuntimeError, NotImplementedError):  # "an invalid python storage"
                continue
            if ptr not in seen:
                seen.add(ptr)
                total += storage.nbytes()
    return total


class TensorsAtLastStep(pl.Callback):
    """Live tensor bytes added from the start of batch 1 to its last optimizer step (agent 0 stepped,
    AdamW state exists): what a batch's updates hold, whatever earlier tests left alive."""

    def __init__(self):
        self.batch, self.steps, self.start, self.added = -1, 0, 0, None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.batch, self.steps = self.batch + 1, 0
        if self.batch == 1:
            self.start = live_tensor_bytes()

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self.steps += 1
        if self.batch == 1 and self.steps == 2:
            self.added = live_tensor_bytes() - self.start


def test_the_callback_keeps_no_copy_of_the_agents_or_their_optimizer_state_during_updates(
    trainer_factory, tmp_path
):
    without, with_ = TensorsAtLastStep(), TensorsAtLastStep()
    run(trainer_factory, 3, [without])
    model = run(trainer_factory, 3, [InterruptCheckpoint(dirpath=str(tmp_path)), with_])
    weights = sum(p.numel() * p.element_size() for p in model.agents.parameters())
    # a copy of the stepped agents' weights and AdamW state would add 3x their weights; the batch
    # end's RNG states (a few KiB) are all the callback holds
    assert abs(with_.added - without.added) < 0.02 * weights, (with_.added, without.added, weights)


@pytest.mark.parametrize(
    "second,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)], ids=["SIGTERM", "Ctrl+C"]
)
def test_a_second_signal_during_the_updates_stops_at_once_saving_nothing(
    trainer_factory, tmp_path, lightning_log, second, code
):
    first = SignalAt(signal.SIGTERM, at=2, hook="on_before_optimizer_step", nth=1)  # agent 0 steps
    again = SignalAt(second, at=2, hook="on_before_backward", nth=2)  # agent 1's backward
    steps = []

    class Steps(pl.Callback):
        def on_before_optimizer_step(self, trainer, pl_module, optimizer):
            steps.append(trainer.global_step)

    stop, before = InterruptCheckpoint(dirpath=str(tmp_path)), signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as info:
        run(trainer_factory, 6, [stop, first, again, Steps()])
    assert info.value.code == code
    assert len(steps) == 2 * 2 + 1  # batches 0, 1 and agent 0 of batch 2: agent 1 never stepped
    assert not os.path.exists(stop.ckpt_path)  # a half-updated batch is no state to resume from
    assert "again: stopping now, saving nothing" in lightning_log.text
    assert signal.getsignal(signal.SIGTERM) is before  # our handlers are gone again
