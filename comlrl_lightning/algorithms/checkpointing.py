"""The checkpoint hooks of :class:`~comlrl_lightning.algorithms.base.CoMLRLModule`: what a checkpoint adds
to Lightning's (the RNG states an exact resume needs, the skip counters), the refusal to save
non-finite weights, and the resume check of a changed config. A mixin, so ``base.py`` keeps the team,
the rollout and validation.
"""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_warn

from comlrl_lightning.infra import resume_config
from comlrl_lightning.infra.resume import canonical_loop_state
from comlrl_lightning.infra.rng import all_ranks_rng_states, collect_rng_states, this_ranks_rng_states

REWARD_MODELS_PREFIX = "reward_models."
"""The state-dict prefix of ``CoMLRLModule.reward_models`` (left out of checkpoints)."""


class CheckpointHooks:
    """``on_save_checkpoint`` / ``on_load_checkpoint`` for a module with ``team``, ``agents``, ``reward_models``,
    ``skipped_steps`` and ``hparams`` (a :class:`~comlrl_lightning.algorithms.base.CoMLRLModule`).
    The states stashed here are applied in ``CoMLRLModule.on_train_start``."""

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Add the global RNG states (python, numpy, torch CPU/CUDA) as ``checkpoint["rng_states"]``
        (every rank's as ``"rng_states_per_rank"`` under several processes), after checking every
        agent's weights are finite.

        Sampling draws from torch's global RNG, so exact resume needs them (Lightning saves agents,
        optimizers, schedulers, loops and the datamodule's data position itself).

        Raises:
            FloatingPointError: an agent's parameter holds NaN/inf (named with the agent); a checkpoint
                of such weights could only poison the run resumed from it.
        """
        for who, model, params in self.trained_modules():
            trained = {id(p) for p in params}
            for name, p in model.named_parameters():
                if id(p) in trained and not torch.isfinite(p).all():
                    raise FloatingPointError(
                        f"{who}: parameter {name!r} holds NaN/inf at {self._batch_position()}; "
                        "refusing to write a checkpoint with non-finite weights"
                    )
        checkpoint["rng_states"] = collect_rng_states()
        checkpoint["rng_states_per_rank"] = all_ranks_rng_states(checkpoint["rng_states"])
        checkpoint["skipped_steps"] = self.skip_counts()
        state = checkpoint.get("state_dict", {})
        frozen = self.team.checkpoint_exclusions()  # what the agents' kinds leave out (reloaded at resume)
        for key in [
            k for k in state if k.startswith(REWARD_MODELS_PREFIX) or k in frozen
        ]:  # frozen: reloaded from their source
            del state[key]

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Keep the saved RNG states until :meth:`on_train_start` applies them: code that runs between
        checkpoint loading and the first batch (``configure_optimizers``, callbacks' ``on_fit_start``,
        starting the train DataLoader) may still draw from the global RNG. Restore the skip counters,
        and rewrite the loop state of a checkpoint written at an epoch end or after ``fit`` into
        the batch-end form Lightning resumes exactly from
        (:func:`~comlrl_lightning.infra.resume.canonical_loop_state`, Lightning #19617).
        Raises ``ResumeConfigError``: a resume changes a field that cannot change (``resume_config.py``)."""
        resume_config.check_resume(checkpoint, dict(self.hparams), self._trainer)  # Python fits too
        self._resume_rng_states = this_ranks_rng_states(checkpoint)
        # the reward models are not saved (on_save_checkpoint): keep the ones configure_model loaded,
        # and ignore those an older checkpoint carries for a module that has none (no env given)
        state = checkpoint.get("state_dict")
        if state is not None:
            own = self.reward_models.state_dict(prefix=REWARD_MODELS_PREFIX)
            for key in [k for k in state if k.startswith(REWARD_MODELS_PREFIX) and k not in own]:
                del state[key]
            for key, value in own.items():
                state[key] = value
            agents = self.agents.state_dict(prefix="agents.")  # frozen bases left out at save: this run's
            for key in self.team.checkpoint_exclusions() - set(state):
                state[key] = agents[key]
        canonical_loop_state(checkpoint)  # epoch-end / after-fit checkpoints resume exactly (infra/resume.py)
        for name, saved in checkpoint.get("skipped_steps", {}).items():
            counts = self.skip_counts().get(name)
            if counts is None or len(saved) != len(counts):  # e.g. an IAC checkpoint in MAGRPO (strict=False)
                rank_zero_warn(
                    f"checkpoint: skipped_steps[{name!r}] has {len(saved)} entries, this module has "
                    f"{0 if counts is None else len(counts)}; those counters start at 0"
                )
                continue
            counts[:] = saved

    def trained_modules(self) -> list[tuple[str, torch.nn.Module, list[torch.nn.Parameter]]]:
        """``(name, module, the parameters its optimizer steps)`` of everything an optimizer steps, as
        messages name it (``"agent 0"``, ...): what :meth:`on_save_checkpoint` checks for non-finite
        weights (an agent's parameters: ``Team.trainable_parameters``)."""
        return [(f"agent {i}", m, self.team.trainable_parameters(i)) for i, m in enumerate(self.agents)]

    def skip_counts(self) -> dict[str, list[int]]:
        """The counters of skipped non-finite steps, by owner kind (saved in checkpoints, so a resumed
        run's ``z_agent_<i>/skipped_steps`` goes on from the saved count)."""
        return {"agents": self.skipped_steps}
