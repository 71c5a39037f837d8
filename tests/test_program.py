"""The `npusim` program (npusim.__main__): OpenBLAS's idle threads are told to sleep
before numpy loads, unless the user said otherwise."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from npusim.__main__ import BLAS_IDLE_SPIN

CHECK = ("import os, sys; import npusim.__main__ as m; before = 'numpy' in sys.modules; "
         "sys.argv = ['npusim', 'op', '--list']; code = m.program(); "
         f"print(code, before, os.environ.get('{BLAS_IDLE_SPIN[0]}'), 'numpy' in sys.modules)")


@pytest.mark.parametrize("given, expected", [(None, BLAS_IDLE_SPIN[1]), ("28", "28")])
def test_the_blas_idle_spin_is_set_before_numpy_loads(given, expected):
    env = {k: v for k, v in os.environ.items() if k != BLAS_IDLE_SPIN[0]}
    if given is not None:
        env[BLAS_IDLE_SPIN[0]] = given
    out = subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, check=True).stdout
    assert out.splitlines()[-1] == f"0 False {expected} True"
