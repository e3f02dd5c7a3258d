"""One memory measurement, run in a fresh process so its peak RSS is its own.

Usage: ``python benchmarks/speed/memory_child.py '{"model": "builtin:tiny-gpt2", "num_agents": 2, "share_weights": true}'``.
Builds our module, trains two short batches through Lightning (so gradients and AdamW state exist),
and prints one JSON line: peak RSS after the imports (``base_rss_mb``) and at the end
(``peak_rss_mb``, ``resource.getrusage(RUSAGE_SELF).ru_maxrss``), the bytes of distinct parameter
storages, and the bytes of optimizer state.
"""

from __future__ import annotations

import json
import os
import resource
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
import bench_paths  # noqa: E402,F401 - every benchmarks/<concern>/ on sys.path
from bench_lib import Setup, build_ours, fit_ours, optimizer_state_bytes, unique_param_bytes  # noqa: E402


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def main(spec: dict) -> dict:
    base = _rss_mb()
    setup = Setup(num_agents=spec["num_agents"], share_weights=spec["share_weights"], model=spec["model"],
                  k=2, batch_size=1, max_new_tokens=spec.get("max_new_tokens", 8), lr=1e-6)  # fmt: skip
    module = build_ours(setup)
    params = unique_param_bytes(module.agents)
    fit_ours(setup, 2, module=module)
    opt_bytes = optimizer_state_bytes(module.trainer.optimizers)
    return {
        "base_rss_mb": base,
        "peak_rss_mb": _rss_mb(),
        "param_bytes": params,
        "optimizer_state_bytes": opt_bytes,
    }


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
