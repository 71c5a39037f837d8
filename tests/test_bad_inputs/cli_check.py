"""Shared check of the bad-input catalogue: a command that must fail cleanly."""

from __future__ import annotations

import os
import re
import signal
import time

import pytest

from npusim.cli import main


def fails_cleanly(argv: list[str], capsys, expect: str, outputs=(), seconds: float = 30) -> str:
    """Run `npusim ARGV` in-process: exit status 2 within `seconds`, one error of at
    most 3 lines that matches `expect` (a regex), no traceback, and none of `outputs` written."""
    start = time.monotonic()
    try:
        code = main([str(a) for a in argv])
    except SystemExit as e:  # argparse's own usage errors
        code = e.code
    out, err = capsys.readouterr()
    assert time.monotonic() - start < seconds, f"took {time.monotonic() - start:.1f} s: {err!r}"
    assert code == 2, f"exit status {code}; stderr: {err!r}"
    lines = err.strip().splitlines()
    assert 1 <= len(lines) <= 3, err
    assert "Traceback" not in err + out, err
    assert re.search(expect, err), err
    for path in outputs:
        assert not path.exists(), f"{path} written by a failed run"
    return err


def one_line_error(call, exc_type, expect: str) -> str:
    """`call()` raises `exc_type` whose message is one line (at most 3) matching `expect`."""
    with pytest.raises(exc_type) as e:
        call()
    msg = str(e.value)
    assert type(e.value) is exc_type or isinstance(e.value, exc_type), repr(e.value)
    assert 1 <= len(msg.splitlines()) <= 3 and len(msg) < 600, msg
    assert re.search(expect, msg), msg
    return msg


def interrupt_at_the_first_replace(monkeypatch) -> list:
    """Ctrl-C arrives as the first finished output replaces its target (os.replace);
    returns the list of targets replaced, filled as they are."""
    real, calls = os.replace, []

    def replace(src, dst):
        if not calls:
            signal.raise_signal(signal.SIGINT)
        calls.append(dst)
        real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    return calls
