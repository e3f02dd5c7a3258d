"""Cooperative coding on HumanEval: problems, prompts, the sandboxed reward, test feedback, and the
DataModule (:mod:`.datamodule`, public as ``comlrl_lightning.datamodules.HumanEvalDataModule``)."""
