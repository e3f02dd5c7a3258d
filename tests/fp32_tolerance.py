"""fp32 tolerances derived from the computation, not from what one CPU happened to give.

Two fp32 evaluations of the same quantity differ because kernels sum in different orders (MKL's
and ATen's vector widths: AVX-512, AVX2, scalar; the reduction tree of a 2-rank all-reduce). For a
sum of ``n`` terms whose magnitudes add up to at most ``scale``, the rounding error is at most
``gamma_n * scale`` with ``gamma_n = n * u / (1 - n * u)`` (Higham, *Accuracy and Stability of Numerical
Algorithms*, 2nd ed., eq. 3.4) and, with the rounding errors independent and of mean zero, about
``sqrt(n) * u * scale`` (Higham & Mary, SIAM J. Sci. Comput. 41(5), 2019, Theorem 3.1, the bound
that holds with probability ``1 - 2 exp(-lambda^2 / 2)`` for ``lambda = 4``, which is the factor
``PROBABILITY_FACTOR``); ``u = 2**-24`` is fp32's unit roundoff. Two evaluations can each be off by that
much, in opposite directions, hence the ``2``. A test states its ``n`` and ``scale`` and adds a
margin for the chained operations around the reduction (``MARGIN``); a bug that changes the
compared value by more than a few parts in 1e5 of ``scale`` still fails.
"""

from __future__ import annotations

import math

UNIT_ROUNDOFF = 2.0**-24
"""fp32's unit roundoff ``u`` (half of ``torch.finfo(torch.float32).eps``)."""
PROBABILITY_FACTOR = 4.0
"""``lambda`` of Higham & Mary's probabilistic bound: it holds with probability >= 1 - 2 exp(-8) per value."""
MARGIN = 4.0
"""For the operations chained around the reduction (a softmax before it, a scale after it, a backward that
repeats the forward's reductions): each adds errors of the same order, so a few times the one-sum bound."""


def sum_atol(scale: float, n: int, margin: float = MARGIN) -> float:
    """Absolute tolerance between two fp32 evaluations of a sum of ``n`` terms whose magnitudes add up to at
    most ``scale``: ``2 * margin * lambda * sqrt(n) * u * scale``, never above the worst-case
    ``2 * margin * gamma_n * scale``.

    Raises:
        ValueError: ``n`` < 1 or ``scale`` < 0.
    """
    if n < 1 or scale < 0:
        raise ValueError(f"sum_atol: n must be >= 1 and scale >= 0, got n={n}, scale={scale}")
    gamma = n * UNIT_ROUNDOFF / (1 - n * UNIT_ROUNDOFF)
    return 2 * margin * min(PROBABILITY_FACTOR * math.sqrt(n) * UNIT_ROUNDOFF, gamma) * scale
