"""The coding family (opt-in): cooperative coding on HumanEval with its sandbox.

Problems (:mod:`.data`), prompts, the sandboxed reward (:mod:`.reward`) and its trusted verdicts
(:mod:`.judge`, :mod:`.verdict`), the helper's stand-ins (:mod:`.standin`), test feedback, and the
DataModule (:mod:`.datamodule`, public as ``comlrl_lightning.datamodules.HumanEvalDataModule``); the
isolated execution of generated code is :mod:`.sandbox`. Nothing in the core imports this package
(``tests/test_structure.py``); ``docs/rewards.md`` and ``docs/attacks.md`` describe it.
"""
