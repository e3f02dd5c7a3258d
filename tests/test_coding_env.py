"""The HumanEval cooperative coding task: data, test extraction, completion cleaning, rewards."""

from __future__ import annotations

import gzip
import json
import random

import pytest

from comlrl_lightning.coding.reward import (
    CooperativeCodeReward,
    HelperPrompt,
    MainPrompt,
    SinglePrompt,
    clean_completion,
    extract_tests,
    load_humaneval_rows,
    prompt_preamble,
    split_tests,
    train_val_split,
)
from comlrl_lightning.coding.single_agent import SingleAgentCodeReward, all_tests_pass
from comlrl_lightning.envs.base import DecPOMDP, Episode
from comlrl_lightning.envs.rewards import RewardFunction


@pytest.fixture(scope="module")
def rows():
    return load_humaneval_rows()


@pytest.fixture(scope="module")
def he0(rows):
    return rows[0]  # has_close_elements, 7 asserts


@pytest.fixture(scope="module")
def coop():
    return CooperativeCodeReward(max_workers=2)


TRIVIAL_AUX = "```python\ndef aux(x):\n    return x\n```"


def _main(row):
    return "```python\n" + row["prompt"] + row["canonical_solution"] + "```"


def test_load_humaneval_rows_and_custom_files(rows, tmp_path):
    assert len(rows) == 164 and rows[0]["task_id"] == "HumanEval/0"
    assert rows[0]["entry_point"] == "has_close_elements"
    path = tmp_path / "mini.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.write(json.dumps(rows[3]) + "\n\n" + json.dumps(rows[4]) + "\n")
    assert [r["task_id"] for r in load_humaneval_rows(str(path))] == ["HumanEval/3", "HumanEval/4"]
    (tmp_path / "list.json").write_text(json.dumps([rows[5]]))
    assert load_humaneval_rows(str(tmp_path / "list.json"))[0]["entry_point"] == rows[5]["entry_point"]
    (tmp_path / "bad.jsonl").write_text(json.dumps({"task_id": "x", "prompt": "p"}) + "\n")
    with pytest.raises(ValueError, match="entry_point"):
        load_humaneval_rows(str(tmp_path / "bad.jsonl"))


def test_extract_tests_on_real_problems(rows, he0):
    tests = extract_tests(he0["test"], "has_close_elements")
    assert len(tests) == 7
    assert tests[0] == "assert has_close_elements([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.3) == True"
    assert all("candidate" not in t for t in tests)
    setup, _ = split_tests(he0["test"], "has_close_elements")
    assert "METADATA" in setup and "def check" not in setup
    # HumanEval/32: asserts inside a loop -> the whole check() is one test, check goes to setup.
    setup, tests = split_tests(rows[32]["test"], "find_zero")
    assert tests == ["check(find_zero)"] and "def check(candidate)" in setup
    # HumanEval/151: setup statements between asserts precede the asserts that follow them.
    tests = extract_tests(rows[151]["test"], "double_the_difference")
    assert len(tests) == 7 and tests[-1].startswith("lst = list(range(-99, 100, 2))\nodd_sum =")
    assert "lst =" not in tests[0]


def test_extract_tests_multiline_asserts_and_errors():
    code = (
        "def check(candidate):\n    import math\n    assert candidate(\n        1,\n        2) == 3, 'msg'\n"
    )
    assert extract_tests(code, "add") == ["import math\nassert add(1, 2) == 3, 'msg'"]
    with pytest.raises(ValueError, match="no `def check"):
        extract_tests("assert True\n", "f")


def test_clean_completion_cases():
    fenced = "Here is the code:\n```python\ndef f(x):\n    return x + 1\n```\nIt adds one."
    assert clean_completion(fenced) == "def f(x):\n    return x + 1"
    prose = "Sure! This works.\nimport math\n\ndef f(x):\n    return math.sqrt(x)\n\nThis function uses sqrt."
    assert clean_completion(prose) == "import math\n\ndef f(x):\n    return math.sqrt(x)"
    tail = (
        'def f(x):\n    return 2 * x\n\nprint(f(3))\nassert f(1) == 2\nif __name__ == "__main__":\n    f(2)\n'
    )
    assert clean_completion(tail) == "def f(x):\n    return 2 * x"
    two_blocks = (
        "```\npip install x\n```\n```python\n@cache\ndef g():\n    return 1\n```\n```python\ng()\n```"
    )
    assert clean_completion(two_blocks) == "@cache\ndef g():\n    return 1"
    assert clean_completion("```python\ndef h():\n    return 3\n") == "def h():\n    return 3"  # unterminated
    assert clean_completion("    return x + 1\n") == "    return x + 1"  # a bare body keeps its indent
    consts = "Code:\nimport math\nN = 3\ndef k():\n    return N\nM = k()\nCACHE = {}\nk()\n"
    assert clean_completion(consts) == "import math\n\nN = 3\n\ndef k():\n    return N\n\nCACHE = {}"


def test_prompts_name_the_parts(he0):
    helper, main, single = HelperPrompt()(he0), MainPrompt()(he0), SinglePrompt()(he0)
    assert "`aux`" in helper and "has_close_elements" in helper and "```python" in helper
    assert "aux(...)" in main and he0["prompt"].strip() in main and "`has_close_elements`" in main
    assert he0["prompt"].strip() in single
    env = DecPOMDP([HelperPrompt(), MainPrompt()], CooperativeCodeReward())
    assert env.num_agents == 2 and env.observe(Episode(0, he0), 1) == main


def test_canonical_main_with_trivial_aux_passes_all_tests(coop, rows, he0):
    assert isinstance(coop, RewardFunction) and coop.name == "coop_code"
    eps = [Episode(0, he0), Episode(2, rows[2]), Episode(32, rows[32])]
    result = coop([[TRIVIAL_AUX, _main(ep.data)] for ep in eps], eps, 0)
    assert result.values == [pytest.approx(3.0)] * 3  # 0.4 + 0.6 + 0.5 + 1.5; no cooperation bonus
    assert result.metrics["all_passed"] == [1.0, 1.0, 1.0]
    assert {k: result.metrics[k][0] for k in coop.LEVELS} == {
        "aux_defined": 0.4,
        "main_defined": 0.6,
        "syntax": 0.5,
        "tests": 1.5,
        "coop_calls_aux": 0.0,
        "coop_nontrivial": 0.0,
    }


def test_wrong_main_gets_less(coop, he0):
    wrong = he0["prompt"] + "    return False\n"
    comp = coop.score_joint_action(TRIVIAL_AUX, wrong, he0)
    assert comp["tests"] == pytest.approx(1.5 * 3 / 7)  # 3 of the 7 asserts expect False
    assert sum(comp.values()) == pytest.approx(1.5 + 1.5 * 3 / 7)
    assert coop([[TRIVIAL_AUX, wrong]], [Episode(0, he0)], 0).metrics["all_passed"] == [0.0]
    assert "assert has_close_elements" in coop.report_for([TRIVIAL_AUX, wrong], he0).tests[0].message


def test_missing_entry_point_gets_structure_only(coop, he0):
    comp = coop.score_joint_action(TRIVIAL_AUX, "def helper(x):\n    return x\n", he0)
    assert sum(comp.values()) == pytest.approx(0.4) and comp["main_defined"] == 0.0
    assert coop.report_for([TRIVIAL_AUX, "def helper(x):\n    return x\n"], he0) is None  # nothing was run
    comp = coop.score_joint_action("def aux(x):\n    print(x)\n", "no code here", he0)
    assert sum(comp.values()) == 0.0  # aux without return earns nothing either


def test_syntax_error_gets_no_test_credit(coop, he0):
    broken = he0["prompt"] + "    for a in numbers\n        return True\n"
    comp = coop.score_joint_action(TRIVIAL_AUX, broken, he0)
    assert comp["main_defined"] == 0.6 and comp["syntax"] == 0.0 and comp["tests"] == 0.0
    assert sum(comp.values()) == pytest.approx(1.0)
    assert coop([[TRIVIAL_AUX, broken]], [Episode(0, he0)], 0).metrics["all_passed"] == [0.0]


def test_cooperation_bonus_only_when_aux_is_called(coop, he0):
    aux = "def aux(a, b):\n    return abs(a - b)\n"
    calls = he0["prompt"] + (
        "    for i, x in enumerate(numbers):\n        for j, y in enumerate(numbers):\n"
        "            if i != j and aux(x, y) < threshold:\n                return True\n    return False\n"
    )
    comp = coop.score_joint_action(aux, calls, he0)
    # a bool output: any changed output is the perturbed one, so the wrapper test cannot credit the
    # second half here (docs/attacks.md, "Bool outputs"); a float problem earns 4.0 in
    # tests/test_adversarial_coop.py::test_genuine_cooperation_earns_the_bonus
    assert comp["coop_calls_aux"] == 0.5 and comp["coop_nontrivial"] == 0.0
    assert sum(comp.values()) == pytest.approx(3.5)
    full_aux = "def aux(numbers, threshold):\n" + he0["canonical_solution"]
    wrapper = "def has_close_elements(numbers, threshold):\n    return aux(numbers, threshold)\n"
    comp = coop.score_joint_action(full_aux, wrapper, he0)
    assert (comp["tests"], comp["coop_calls_aux"], comp["coop_nontrivial"]) == (1.5, 0.5, 0.0)
    comp = coop.score_joint_action(aux, he0["prompt"] + he0["canonical_solution"], he0)
    assert comp["coop_calls_aux"] == 0.0 and sum(comp.values()) == pytest.approx(3.0)
    failing = "def has_close_elements(numbers, threshold):\n    return [aux(1, 2)]\n"
    comp = coop.score_joint_action(aux, failing, he0)  # calls aux but passes no test: no bonus
    assert comp["tests"] == 0.0 and comp["coop_calls_aux"] == 0.0


def test_reward_checks_the_number_of_agents(coop, he0):
    with pytest.raises(ValueError, match="needs 2 agents"):
        coop([["only one"]], [Episode(0, he0)], 0)


def test_single_agent_reward_is_the_pass_fraction(rows, he0):
    reward = SingleAgentCodeReward(max_workers=2)
    assert reward.name == "pass_rate"
    eps = [Episode(0, he0)] * 4
    texts = [
        he0["canonical_solution"],  # body only
        "```python\n" + he0["prompt"] + he0["canonical_solution"] + "```",  # whole function
        "    return False\n",  # wrong body: 3/7
        "return True",  # unindented body: re-indented, 4/7
    ]
    result = reward([[t] for t in texts], eps, 0)
    assert result.values == [1.0, 1.0, pytest.approx(3 / 7), pytest.approx(4 / 7)]
    assert result.metrics["all_passed"] == [1.0, 1.0, 0.0, 0.0]
    program = prompt_preamble(rows[32]["prompt"], "find_zero") + "\n" + "def find_zero(xs):\n    return 0.0\n"
    assert "def poly" in program and not all_tests_pass(program, rows[32])
    assert all_tests_pass(rows[32]["prompt"] + rows[32]["canonical_solution"], rows[32])


def test_train_val_split_is_fixed(rows):
    train, val = train_val_split(rows, val_fraction=0.2, seed=0)
    assert (len(train), len(val)) == (131, 33)
    ids = lambda rs: [r["task_id"] for r in rs]  # noqa: E731
    assert set(ids(train)).isdisjoint(ids(val)) and len(set(ids(train)) | set(ids(val))) == 164
    shuffled = list(rows)
    random.Random(1).shuffle(shuffled)
    assert sorted(ids(train_val_split(shuffled, 0.2, seed=0)[1])) == sorted(ids(val))  # order-independent
    assert ids(val) == sorted(ids(val), key=lambda t: int(t.split("/")[1]))  # input order kept
    assert set(ids(train_val_split(rows, 0.2, seed=1)[1])) != set(ids(val))
    with pytest.raises(ValueError, match="val_fraction"):
        train_val_split(rows, val_fraction=1.0)


def test_a_definition_cut_off_by_the_token_limit_is_dropped():
    from comlrl_lightning.coding.reward import clean_completion

    text = "def f(x):\n    return x + 1\n\ndef aux(y):\n    return y\n\ndef f(x) -> int:"
    assert clean_completion(text) == "def f(x):\n    return x + 1\n\ndef aux(y):\n    return y"
    unfinished_new_name = (
        "def g():\n    return 1\n\ndef h(:\n"  # h is defined nowhere else: kept, fails syntax
    )
    assert clean_completion(unfinished_new_name).endswith("def h(:")


def test_an_empty_fence_pair_before_the_code_block_does_not_hide_the_code():
    from comlrl_lightning.coding.reward import clean_completion

    text = "```\n\n```python\ndef below(l: list, t: int) -> bool:\n    return all(x < t for x in l)\n```\n\nThis uses all()."
    assert clean_completion(text) == "def below(l: list, t: int) -> bool:\n    return all(x < t for x in l)"


def test_a_helper_under_another_name_is_scored_as_aux_unless_strict(he0):
    from comlrl_lightning.coding.reward import CooperativeCodeReward, helper_as_aux

    renamed = helper_as_aux("def dist(a, b):\n    return abs(a - b) if a > b else dist(b, a)")
    assert renamed.startswith("def aux(a, b):") and "aux(b, a)" in renamed
    assert helper_as_aux("def aux(x):\n    return x\n\ndef g():\n    return 1").startswith("def aux(x):")
    helper = "def dist(a, b):\n    return abs(a - b)"
    lenient = CooperativeCodeReward().score_joint_action(helper, he0["prompt"] + "    return False\n", he0)
    strict = CooperativeCodeReward(rename_helper=False).score_joint_action(
        helper, he0["prompt"] + "    return False\n", he0
    )
    assert lenient["aux_defined"] == 0.4 and strict["aux_defined"] == 0.0
