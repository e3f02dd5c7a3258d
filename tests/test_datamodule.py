import json

import pytest

from comlrl_lightning.datamodules import DecPOMDPDataModule, load_rows
from comlrl_lightning.envs.base import Episode, PromptTemplate
from comlrl_lightning.envs.toy import TargetLengthReward

ROWS = [{"q": f"question {i}", "id": i} for i in range(10)]


def write(tmp_path, ext):
    path = tmp_path / f"data.{ext}"
    if ext == "jsonl":
        path.write_text("\n".join(json.dumps(r) for r in ROWS))
    elif ext == "json":
        path.write_text(json.dumps(ROWS))
    else:
        import datasets

        datasets.Dataset.from_list(ROWS).to_parquet(str(path))
    return path


@pytest.mark.parametrize("ext", ["json", "jsonl", "parquet"])
def test_local_files_load_as_datasets(tmp_path, ext):
    rows = load_rows(str(write(tmp_path, ext)))
    assert len(rows) == 10 and rows[3]["q"] == "question 3"


def test_unsupported_extension_names_allowed_ones(tmp_path):
    p = tmp_path / "data.txt"
    p.write_text("x")
    with pytest.raises(ValueError, match=r"\.jsonl"):
        load_rows(str(p))


def test_batches_are_lists_of_episodes_with_per_agent_prompts(tmp_path):
    dm = DecPOMDPDataModule(str(write(tmp_path, "jsonl")), ["A: {q}", "B: {q}"], TargetLengthReward(4),
                            val_fraction=0.2, batch_size=3)  # fmt: skip
    dm.setup("fit")
    assert len(dm.train_rows) == 8 and len(dm.val_rows) == 2
    assert not {r["id"] for r in dm.train_rows} & {r["id"] for r in dm.val_rows}
    batch = next(iter(dm.train_dataloader()))
    assert len(batch) == 3 and all(isinstance(e, Episode) for e in batch)
    ep = batch[0]
    assert dm.env.observe(ep, 0) == f"A: {ep.data['q']}" and dm.env.observe(ep, 1) == f"B: {ep.data['q']}"


def test_shuffle_is_seeded_and_skip_resumes_mid_epoch():
    dm = DecPOMDPDataModule(ROWS, ["{q}"], TargetLengthReward(4), batch_size=2, seed=3)
    dm.setup("fit")
    first = [[e.index for e in b] for b in dm.train_dataloader()]
    assert first != [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
    dm.load_state_dict({"batches_in_epoch": 2})
    resumed = [[e.index for e in b] for b in dm.train_dataloader()]
    assert resumed == first[2:]


def test_missing_template_field_names_it():
    with pytest.raises(KeyError, match="uses field 'missing'"):
        PromptTemplate("{missing}")({"q": 1})


def test_reward_is_required():
    with pytest.raises(ValueError, match="data.reward"):
        DecPOMDPDataModule(ROWS, ["{q}"])


def test_missing_local_file_names_the_field(tmp_path):
    with pytest.raises(FileNotFoundError, match="data.dataset: no file"):
        load_rows(str(tmp_path / "nope.jsonl"))
