"""Float tolerances stated relative to the scale of what is compared.

XLA:CPU generates different code on different CPUs (vector width, FMA contraction), so sums are
reassociated and a float32 result moves by a few units in the last place (ulps) from one machine
to the next. A tolerance is therefore a few ulps of the operands, or an explicit bound for an
accumulated sum, and never an absolute value below one ulp of the quantities compared (a parameter
near 1 has an ulp of 1.2e-7). Tests that claim bit-identical results (kill-and-resume, 8 devices
= 1 device) compare two runs on the same machine and keep exact equality.
"""

from __future__ import annotations

import numpy as np


def ulps(scale, count: float = 4, dtype=np.float32) -> float:
    """``count`` float32 (or ``dtype``) rounding steps at the magnitude of ``scale``.

    ``count * eps(dtype) * max|scale|``: eps times |x| is between one and two ulps of x, so this
    allows ``count`` to ``2 * count`` ulps at the largest operand.
    """
    return float(count * np.finfo(dtype).eps * np.max(np.abs(np.asarray(scale, np.float64))))
