"""Algorithms forward :class:`CoMLRLModule`'s arguments through ``**kwargs`` instead of copying them,
and LightningCLI (jsonargparse, which follows ``super().__init__(**kwargs)``) still lists each one
with its type, default and docstring."""

import inspect

import pytest
from jsonargparse import ArgumentParser

from comlrl_lightning import (
    IAC,
    MAAC,
    MADPO,
    MAGRPO,
    MARLOO,
    CentralizedMAGRPO,
    CoMLRLModule,
    MADPOIter,
    MARLHFIter,
)

BASE = ("optimizer", "scheduler", "learning_rate", "val_sampling", "env")
FORWARDING = [MAGRPO, MARLOO, CentralizedMAGRPO, IAC, MAAC, MADPO, MADPOIter, MARLHFIter]


@pytest.mark.parametrize("cls", FORWARDING, ids=lambda c: c.__name__)
def test_an_algorithm_does_not_copy_the_base_arguments(cls):
    own = set(inspect.signature(cls.__init__).parameters)
    assert not own & set(BASE), f"{cls.__name__} re-declares {sorted(own & set(BASE))}"
    assert "kwargs" in own


@pytest.mark.parametrize("cls", FORWARDING, ids=lambda c: c.__name__)
def test_the_cli_lists_every_forwarded_argument_with_its_type_default_and_doc(cls):
    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(cls, "model", fail_untyped=False)
    actions = {a.dest: a for a in parser._actions}
    assert all(f"model.{name}" in actions for name in BASE)
    lr, val = actions["model.learning_rate"], actions["model.val_sampling"]
    base = inspect.signature(CoMLRLModule.__init__).parameters
    assert lr.default == base["learning_rate"].default == 5e-6
    assert "learning rate of the default optimizer" in lr.help and lr._typehint is float
    assert "greedy decoding" in val.help and val._typehint is bool
    given = parser.parse_args(["--model.agents=builtin:tiny-gpt2", "--model.learning_rate=1e-4"])
    assert given.model.learning_rate == 1e-4


def test_marlhf_iter_forwards_the_rl_module_arguments_but_not_the_pair_source():
    """MARLHFIter declares only its own groups; MARLHF's RL arguments reach the CLI through ``**kwargs``,
    and ``pair_source`` (the rounds make the pairs) is neither listed nor accepted."""
    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(MARLHFIter, "model", fail_untyped=False)
    dests = {a.dest.split(".")[1] for a in parser._actions if a.dest.startswith("model.")}
    assert {"rollout", "advantage", "loss", "sampling", "placement", "critics", "critic", "rl_phase"} <= dests
    assert "pair_source" not in dests
    with pytest.raises(TypeError, match="'pair_source'"):
        MARLHFIter(agents=["builtin:tiny-gpt2"] * 2, pair_source={"pairs_path": None})
