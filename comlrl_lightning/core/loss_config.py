"""Where :class:`LossConfig` was declared before it moved beside the loss it configures
(:mod:`comlrl_lightning.core.loss`); this path keeps working (a re-export, no warning).
"""

from comlrl_lightning.core.loss import ImportanceSamplingLevel, KLMode, LossConfig, LossType, OnNonfinite

__all__ = ["ImportanceSamplingLevel", "KLMode", "LossConfig", "LossType", "OnNonfinite"]
