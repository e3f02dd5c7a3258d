"""`AdapterConfig`: a per-agent LoRA adapter (PEFT's ``LoraConfig`` names), checked without loading anything.

An agent whose :class:`~comlrl_lightning.team.agents.AgentSpec` has ``adapter`` trains only its adapter;
its base is frozen (its own, or an earlier adapter agent's with ``share_weights_with``: held once).
Building it is :class:`~comlrl_lightning.team.kinds.LoraAdapter`'s work (the ``peft`` extra).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, fields
from typing import Any


@dataclass
class AdapterConfig:
    """A LoRA adapter on an agent's frozen base (PEFT ``LoraConfig`` / TRL ``--lora_*`` names).

    Attributes:
        r: rank of the low-rank update (>= 1). Default 8 (PEFT's).
        lora_alpha: scaling numerator; the update is scaled by ``lora_alpha / r`` (> 0). Default 16.
        target_modules: module names (or name suffixes) that get an adapter, or ``"all-linear"``
            (every linear layer but the output layer, PEFT's shorthand). Default ``"all-linear"``.
        lora_dropout: dropout on the adapter's input, in [0, 1). Default 0.0: RL log-probs must come
            from the distribution that sampled the completions (every other dropout is off too).
    """

    r: int = 8
    lora_alpha: float = 16
    target_modules: list[str] | str = "all-linear"
    lora_dropout: float = 0.0

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> AdapterConfig:
        """The config of a YAML / ``asdict`` mapping.

        Raises:
            ValueError: an unknown key, naming it and the allowed ones.
        """
        allowed = [f.name for f in fields(cls)]
        bad = sorted(set(values) - set(allowed))
        if bad:
            raise ValueError(f"agents[*].adapter: unknown keys {bad}, allowed: {allowed}")
        return cls(**values)

    def check(self, where: str) -> None:
        """Raises ValueError naming ``<where>.<field>``, the value and what is allowed; also when
        the ``peft`` package (the ``lora`` extra) is missing."""
        if isinstance(self.r, bool) or not isinstance(self.r, int) or self.r < 1:
            raise ValueError(f"{where}.r: got {self.r!r}, allowed: an integer >= 1")
        if (
            isinstance(self.lora_alpha, bool)
            or not isinstance(self.lora_alpha, (int, float))
            or not self.lora_alpha > 0
        ):
            raise ValueError(f"{where}.lora_alpha: got {self.lora_alpha!r}, allowed: a number > 0")
        if (
            isinstance(self.lora_dropout, bool)
            or not isinstance(self.lora_dropout, (int, float))
            or not 0 <= self.lora_dropout < 1
        ):
            raise ValueError(
                f"{where}.lora_dropout: got {self.lora_dropout!r}, allowed: 0 <= lora_dropout < 1"
            )
        targets = self.target_modules
        if not (
            (isinstance(targets, str) and targets)
            or (
                isinstance(targets, (list, tuple))
                and targets
                and all(isinstance(t, str) and t for t in targets)
            )
        ):
            raise ValueError(
                f"{where}.target_modules: got {targets!r}, allowed: 'all-linear' or a non-empty list of "
                "module names (e.g. ['q_proj', 'v_proj'])"
            )
        if importlib.util.find_spec("peft") is None:
            raise ValueError(
                f"{where}: a LoRA adapter needs the 'peft' package, which is not installed: "
                "pip install 'comlrl-lightning[lora]' (make setup installs it)"
            )

    def peft_config(self) -> object:
        """PEFT's ``LoraConfig`` for a causal LM with these fields (imports ``peft``)."""
        from peft import LoraConfig

        targets = self.target_modules if isinstance(self.target_modules, str) else list(self.target_modules)
        return LoraConfig(
            r=self.r,
            lora_alpha=self.lora_alpha,
            target_modules=targets,
            lora_dropout=float(self.lora_dropout),
            task_type="CAUSAL_LM",
        )
