"""The route for a new task: one module (this file) holds its rows, its shared reward and its DataModule,
and the CLI trains it through ``data.class_path``, with no change to the library (the shipped tasks add a
folder under ``tasks/`` and a registration line only for a short public path)."""

from typing import Any

from test_cli import fit

from comlrl_lightning.datamodules.decpomdp import DecPOMDPDataModule


class SameLengthReward:
    """Shared reward ``1 / (1 + |len(c0) - len(c1)|)`` (characters): neither agent earns it alone."""

    name = "same_length"
    scored: list = []

    def __call__(self, joint_actions, episodes, turn) -> list[float]:
        SameLengthReward.scored.extend((a[0], a[1], e.data["word"]) for a, e in zip(joint_actions, episodes))
        return [1.0 / (1 + abs(len(a[0]) - len(a[1]))) for a in joint_actions]


class SameLengthDataModule(DecPOMDPDataModule):
    """Two agents answer about a colour; the team is paid for equal lengths."""

    def __init__(self, num_rows: int = 16, **kwargs: Any) -> None:
        super().__init__(formatters=("Say {word}:", "Echo {word}:"), reward=SameLengthReward(), **kwargs)
        self.num_rows = num_rows

    def load_train_val(self) -> tuple[Any, Any]:
        rows = [{"word": w} for w in ("red", "blue", "green", "gold")] * (self.num_rows // 4)
        return rows, rows[:4]


def test_a_task_named_in_yaml_is_what_the_team_trains_on(tmp_path):
    SameLengthReward.scored.clear()
    events = fit("toy_length_ratio.yaml", tmp_path, "--data.class_path=test_task_yaml.SameLengthDataModule",
                 "--data.init_args.num_rows=8", "--trainer.max_steps=2", "--trainer.limit_val_batches=0",
                 "--validate_before_fit=false")  # fmt: skip
    assert events
    # the team's joint actions were scored by this file's reward, on this file's rows
    assert len(SameLengthReward.scored) >= 2 * 2 and {w for *_, w in SameLengthReward.scored} <= {
        "red", "blue", "green", "gold"
    }  # fmt: skip
