"""Host memory: give freed tensor memory back to the operating system (glibc's allocator).

Why: PyTorch's CPU allocator is plain ``malloc``. glibc serves a request above its mmap threshold
with its own ``mmap`` (returned to the system on ``free``), but after the first such free it raises
the threshold to that size (up to 32 MiB), so from then on activations, logits and gradients of a
few MiB come from the heap. Freed heap memory is kept by the process, and a step whose tensors
have other sizes than the last one's cannot reuse all of it: the resident set grows step after
step (in the main job, +1.9 GB from the first training batch to the second, on top of the 4.1 GB
that weights, gradients and AdamW state need). A fixed threshold turns that adjustment off: every
allocation of at least ``threshold_bytes`` is its own mapping and leaves the resident set when
freed. The cost: the kernel maps and zeroes the pages of each such tensor anew.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

M_MMAP_THRESHOLD = -3
"""``mallopt`` parameter number of the mmap threshold (glibc ``malloc.h``)."""
DEFAULT_THRESHOLD_BYTES = 1 << 20
"""1 MiB: parameter, gradient and activation tensors of LLMs are larger; small objects stay on the heap."""


def release_freed_memory(threshold_bytes: int = DEFAULT_THRESHOLD_BYTES) -> bool:
    """Fix glibc's mmap threshold so large freed tensors leave the resident set at once.

    Process-wide; affects allocations made after the call. A no-op (returns False) where the C
    library is not glibc (macOS, Windows, musl).

    Args:
        threshold_bytes: allocations of at least this many bytes get their own mapping (> 0).

    Raises:
        ValueError: ``threshold_bytes <= 0``.
    """
    if threshold_bytes <= 0:
        raise ValueError(f"threshold_bytes: got {threshold_bytes}, must be > 0")
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, int(threshold_bytes)))
