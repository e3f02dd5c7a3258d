"""Where the benchmarks live. Importing this module puts every ``benchmarks/<concern>/`` folder, then
``benchmarks/`` itself (``run.py``), on ``sys.path`` (the scripts import each other by module name,
whichever folder holds them) and names the paths they share. A script run directly reaches it with one line first::

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
    from bench_paths import BENCH, ROOT  # noqa: E402
"""

from __future__ import annotations

import os
import sys

BENCH = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
"""``benchmarks/``: ``run.py``, ``RESULTS.md``, ``results.json`` and the plots it links."""
ROOT = os.path.dirname(BENCH)
"""The repository (configs, tests, the package)."""
CONCERNS = ("lib", "speed", "learning", "cooperation", "gpu", "attacks", "ui")
"""The folders of ``benchmarks/``, one per concern; ``lib`` is what several share."""

for _folder in reversed([os.path.join(BENCH, c) for c in CONCERNS] + [BENCH]):  # run.py last
    if _folder not in sys.path:
        sys.path.insert(0, _folder)
