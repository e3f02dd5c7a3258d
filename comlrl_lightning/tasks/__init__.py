"""Tasks built on the Dec-POMDP protocol, each in its own folder ``tasks/<name>/``: its rows (problems),
prompts, reward and transitions, and its DataModule in ``datamodule.py``.

- :mod:`.toy`: length coordination, two tiny agents on CPU (``LengthRatioDataModule``).
- :mod:`.cooperation`: coordination, division, dependence (``CooperationDataModule``).

Cooperative coding on HumanEval (``HumanEvalDataModule``) is an opt-in family with its sandbox:
:mod:`comlrl_lightning.coding`, laid out the same way.

Adding a task is one folder here and one registration line: the DataModule's import in
``datamodules/__init__.py``, which makes ``comlrl_lightning.datamodules.<Class>`` its public path
(``docs/architecture.md``, "Adding a task"). A task's package ``__init__`` does not import its
DataModule: the DataModule imports the task, not the other way round.
"""
