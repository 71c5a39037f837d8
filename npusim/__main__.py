"""The `npusim` program: its console script and `python -m npusim`. It sets up the
process for a run, then runs cli.main() on sys.argv."""

import gc
import os
import signal
import sys

# OpenBLAS (numpy's BLAS) starts its worker threads when numpy loads, and each spins for
# 2^THREAD_TIMEOUT cycles (28 by default: about 0.1 s) waiting for work before it sleeps.
# npusim's engine makes no BLAS call, so the spinning only takes cycles from the simulation:
# 7% of a `npusim op` on a 2-core machine. 4, the least OpenBLAS accepts, lets them sleep
# at once; the next BLAS call wakes them all. It must be set before numpy loads (npusim.cli
# loads it); a value the user set is kept, and sweep workers inherit it.
BLAS_IDLE_SPIN = ("OPENBLAS_THREAD_TIMEOUT", "4")


def program() -> int:
    """main() on sys.argv, with the cyclic garbage collector run rarely (npusim.collector).
    Before the interpreter exits, everything still alive - the lowered kernels, the
    simulators' caches, hundreds of thousands of objects - is moved out of the
    collector's sight (gc.freeze): the collection the interpreter runs at exit would
    traverse all of it for nothing. They are freed by reference counting as usual;
    outputs are closed and renamed before main() returns. Ctrl-C or SIGTERM from then on
    has nothing left to stop and is ignored (it would print a traceback from the middle of
    the interpreter's exit, or end the process with the signal, after the command's last
    line). Not in main(), which the tests and notebooks call in a process that goes on."""
    os.environ.setdefault(*BLAS_IDLE_SPIN)
    from npusim.cli import main
    from npusim.collector import fewer_collections
    from npusim.outputs import Terminated

    code = None
    try:
        with fewer_collections():
            code = main()
    except (KeyboardInterrupt, Terminated) as e:  # as main() returned and its objects were freed
        code = code if code is not None else 143 if isinstance(e, Terminated) else 130
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, signal.SIG_IGN)
    gc.freeze()
    return code


if __name__ == "__main__":
    sys.exit(program())
