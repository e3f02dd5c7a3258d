"""Tasks built on the Dec-POMDP protocol, each in its own folder ``tasks/<name>/``: its rows (problems),
prompts, reward and transitions, and its DataModule in ``datamodule.py``.

- :mod:`.toy`: length coordination, two tiny agents on CPU (``LengthRatioDataModule``).
- :mod:`.coding`: cooperative coding on HumanEval, the sandboxed reward (``HumanEvalDataModule``).
- :mod:`.cooperation`: coordination, division, dependence (``CooperationDataModule``).

Adding a task is one folder here and one registration line: the DataModule's import in
``datamodules/__init__.py``, which makes ``comlrl_lightning.datamodules.<Class>`` its public path
(``docs/architecture.md``, "Adding a task"). A task's package ``__init__`` does not import its
DataModule: the DataModule imports the task, not the other way round.
"""
