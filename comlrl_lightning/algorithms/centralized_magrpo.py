"""Centralized MAGRPO: one joint actor model writes every role's response in one completion
(CoMLRL 1.4.3 ``reinforce/centralized_magrpo.py``).

Features:
    - one trained model (one optimizer); the env's ``N`` formatters are its *roles*
      (``num_roles``, CoMLRL's ``num_agents``: the role count, checked against the env at setup);
    - a :class:`~comlrl_lightning.team.centralized.CentralizedAdapter` (default
      :class:`~comlrl_lightning.team.centralized.TaggedAdapter`, CoMLRL's tagged one) builds the
      joint prompt of the roles' prompts and splits each joint completion into role texts for the
      env's shared reward; a parse failure gives every role the empty text, scored as such, and is
      logged (``centralized/parse_failure``, ``centralized/empty_role``);
    - the group baseline over the ``K`` joint completions of a node; every MAGRPO knob that applies
      to one policy: ``advantage_mode``, ``scale_rewards``, ``loss_type``, ``num_iterations``,
      clipping, ``beta`` / ``kl_mode``, ``mask_truncated_completions``, ``on_nonfinite``;
    - the loss trains on the joint completion's tokens (every token, EOS included, padding masked;
      log-probs of ``logits / temperature``), validation (``val/reward``, ``val/pass@k``),
      checkpoints and exact resume from :class:`MAGRPO` and the base class.

Not supported (refused before any model loads, naming the field): ``num_turns > 1`` (CoMLRL allows
one turn: the joint prompt is built from the roles' turn-0 prompts, and a transition would have to
write a joint history), ``joint_mode="cross"`` (the roles' texts come from one completion, so there
is no combination of separate samples) and credit modes other than ``shared`` (they re-score
combinations of separate samples).

Step counting: one optimizer, so ``global_step`` grows by ``num_iterations`` per batch.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from comlrl_lightning.algorithms.magrpo import MAGRPO
from comlrl_lightning.core import metrics as M
from comlrl_lightning.core.records import StepOutput
from comlrl_lightning.core.rollout import refuse_unsupported
from comlrl_lightning.envs.base import Episode
from comlrl_lightning.team.agents import AgentSpec
from comlrl_lightning.team.centralized import (
    CentralizedAdapter,
    JointActor,
    RoleSplit,
    joint_actor_adapter,
)


class CentralizedMAGRPO(MAGRPO):
    """MAGRPO with one joint actor writing all ``num_roles`` roles' responses in one completion.

    Args:
        agents: the one joint actor (an :class:`AgentSpec`, a model string, or a list of exactly one).
        num_roles: the number of roles (the env's formatters; CoMLRL's ``num_agents``), >= 1; default 2.
        adapter: builds the joint prompt and parses the completion
            (:class:`~comlrl_lightning.team.centralized.CentralizedAdapter`; CoMLRL's adapters fit);
            default :class:`~comlrl_lightning.team.centralized.TaggedAdapter`. Not saved in the
            hyperparameters: pass a custom one again to ``load_from_checkpoint``.
        **kwargs: :class:`MAGRPO`'s other arguments (``rollout``: ``num_turns`` 1, ``joint_mode``
            ``aligned``, ``credit`` ``shared``; ``placement`` places the one model; ``advantage``,
            ``loss``, ``sampling`` and :class:`CoMLRLModule`'s ``optimizer``, ``scheduler``,
            ``learning_rate``, ``val_sampling``, ``env``).

    Raises:
        ValueError: before any model loads: more than one agent, ``num_roles < 1``, ``num_turns > 1``,
            ``joint_mode="cross"``, a credit mode other than ``shared`` (each naming the field), or
            any :class:`MAGRPO` check; at ``setup``: an env whose formatter count is not ``num_roles``.
        TypeError: an adapter without callable ``build_prompt`` and ``parse_completion``.
    """

    unknown_key_hints: ClassVar[dict[str, str]] = {
        "num_agents": "one model plays every role: the role count is 'num_roles' (CoMLRL's num_agents)"
    }
    """Keys of other modules a config may carry here, with what to use instead (``comlrl-lightning``
    prints the hint when the key is refused; :func:`comlrl_lightning.cli_errors.unknown_key`)."""

    def __init__(
        self,
        agents: list[AgentSpec] | AgentSpec | list[str] | str,
        num_roles: int = 2,
        adapter: CentralizedAdapter | None = None,
        **kwargs: Any,
    ) -> None:
        if isinstance(agents, (list, tuple)) and len(agents) != 1:
            raise ValueError(
                f"agents: got {len(agents)} agents; CentralizedMAGRPO trains exactly one joint actor "
                "(the env's formatters are its roles: set num_roles)"
            )
        adapter = joint_actor_adapter(num_roles, adapter)
        one = agents[0] if isinstance(agents, (list, tuple)) else agents
        super().__init__([one], 1, **kwargs)
        cfg = self.rollout_config  # checked here, where a dict (a checkpoint's hparams) is a config
        if cfg.num_turns != 1:
            raise ValueError(
                f"rollout.num_turns: got {cfg.num_turns}, allowed: [1]; centralized MAGRPO rolls out "
                "one turn (as CoMLRL 1.4.3): the joint prompt is built from the roles' turn-0 prompts"
            )
        refuse_unsupported(
            JointActor, cfg.joint_mode, cfg.credit
        )  # the actor's own limits, before any model loads
        self.num_roles, self.adapter = num_roles, adapter
        self.joint_actor = JointActor(self.team, adapter, num_roles)
        for key in ("adapter", "num_agents"):  # an object YAML cannot hold (see Args); MAGRPO's, not ours
            self.hparams.pop(key, None)
            self._hparams_initial.pop(key, None)

    @property
    def actors(self) -> JointActor:
        """The joint actor: one model renders each node's joint prompt and writes every role's part."""
        return self.joint_actor

    @property
    def env_agents(self) -> tuple[int, str]:
        return self.num_roles, "model.num_roles"

    # ------------------------------------------------------------------ the step
    def training_step(self, batch: list[Episode], batch_idx: int) -> StepOutput:
        out = super().training_step(batch, batch_idx)  # MAGRPO's corridor through the joint actor
        out.user_prompts = [list(self.joint_actor.joint_prompts)]  # what the one model was asked
        self.log_parse(self.joint_actor.splits, "", len(batch))
        return out

    def validation_step(self, batch: list[Episode], batch_idx: int) -> dict[str, Any]:
        out = super().validation_step(batch, batch_idx)
        self.log_parse(self.joint_actor.splits, "val/", len(batch))
        return out

    def log_parse(self, splits: list[RoleSplit], prefix: str, num_episodes: int) -> None:
        """``[prefix]centralized/parse_failure`` and ``/empty_role`` of the last rollout's splits."""
        if not splits:
            return
        failed = torch.tensor([s.failed for s in splits], dtype=torch.float32).mean()
        empty = torch.tensor(sum(s.empty for s in splits) / (len(splits) * self.num_roles))
        for name, value in ((M.PARSE_FAILURE, failed), (M.EMPTY_ROLE, empty)):
            self.log(prefix + name, value.to(self.device), batch_size=num_episodes, sync_dist=True)
