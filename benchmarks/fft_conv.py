"""Issue 14's benchmark in one process: the FFT workloads (benchmarks/fft.py: numpy.fft with
out=, scipy.fft workers=1/2, torch.fft, JAX, lazymath) and the conv1d ones (benchmarks/conv1d.py:
torch.nn.functional.conv1d, a numpy reference, lazymath), medians and ratios.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/fft_conv.py [--quick]
"""

from __future__ import annotations

import os
import runpy
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def main() -> None:
    quick = ["--quick"] if "--quick" in sys.argv[1:] else []
    argv = sys.argv
    try:
        for name in ("fft.py", "conv1d.py"):
            sys.argv = [name, *quick]
            runpy.run_path(os.path.join(HERE, name), run_name="__main__")
    finally:
        sys.argv = argv


if __name__ == "__main__":
    main()
