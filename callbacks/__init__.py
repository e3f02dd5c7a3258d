"""Lightning callbacks for multi-agent RL (installed as ``comlrl_lightning.callbacks``)."""

__all__: list[str] = []
