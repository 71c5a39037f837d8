"""Calibration from a user's own measurements: msprof op_summary rows and hccl_test rows
-> npusim ops and collectives -> the config's "assumed" fields fitted by robust least
squares on log error, with a held-out error from k-fold cross-validation -> a config
with `base:` (npusim calibrate).

    profile.py     read op_summary CSVs
    opmap.py       CANN op types -> npusim ops: the table (OPMAP) and map_row
    row_fields.py  a row's dtypes, formats and shapes as the readers need them; Unmappable
    cube_rows.py   OPMAP's readers of matmul, attention, quantised and grouped matmul rows
    vector_rows.py OPMAP's readers of vector and row-wise ops, copies, gathers, top-k
    hccl.py        read hccl_test output -> npusim collectives
    fields.py      which fields may be fitted
    model.py       simulated op times per trial config
    fit.py         selection, solver, k-fold
    session.py     one calibration, end to end
    report.py      text, JSON, plot
    write.py       the calibrated config
    synth.py       synthetic profiles (ground truth for tests and benchmarks)
"""

__all__ = ["Calibration", "calibrate"]


def __getattr__(name: str):
    """Calibration and calibrate, loaded on first use: the command line registers
    `npusim calibrate` without loading the simulator behind it."""
    if name in __all__:
        from npusim.calibrate import session

        return getattr(session, name)
    raise AttributeError(f"module 'npusim.calibrate' has no attribute {name!r}")
