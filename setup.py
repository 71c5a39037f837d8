"""The build's one step pyproject.toml cannot declare: a build of the C extensions
that fails for want of a working C compiler says so in one line, and what to
install, instead of ending deep inside setuptools with the compiler's own error.

Everything else (metadata, packages, the extension modules themselves) is in
pyproject.toml; setuptools reads both (`pip install .` and `python -m build` run
this file's setup() with that configuration).
"""

from __future__ import annotations

import os
import subprocess

from setuptools import setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CCompilerError, CompileError, ExecError, PlatformError

# Where a C compiler comes from, by platform (part of the message).
COMPILER_HINT = ("gcc or clang (Debian/Ubuntu: apt install build-essential python3-dev; Fedora: dnf install "
                 "gcc python3-devel), the Xcode command line tools on macOS (xcode-select --install), or the "
                 "Microsoft C++ Build Tools on Windows")


def no_compiler_message(ext: str, cause: BaseException) -> str:
    """The one line a build that could not compile `ext` ends with."""
    return (f"npusim: compiling its C extension {ext} failed ({_reason(cause)}): npusim needs a C compiler and "
            f"Python's C headers to install - {COMPILER_HINT}")


def _reason(cause: BaseException) -> str:
    """What went wrong, short: the compiler not found, or its exit status (its own
    messages, if any, are printed above), else the error's text."""
    e: BaseException | None = cause
    while e is not None:
        if isinstance(e, subprocess.CalledProcessError):
            return f"{os.path.basename(str(e.cmd[0]))} exited with status {e.returncode}"
        if isinstance(e, FileNotFoundError) and e.filename:
            return f"{e.filename} not found"
        e = e.__cause__ or e.__context__
    return " ".join(str(cause).split())[:300] or type(cause).__name__


class BuildExt(build_ext):
    """build_ext whose compiler failures end in no_compiler_message (setuptools prints
    it as its one `error:` line)."""

    def build_extension(self, ext) -> None:
        try:
            super().build_extension(ext)
        except (CCompilerError, ExecError, PlatformError, OSError) as e:  # a compile or link that could not run
            raise CompileError(no_compiler_message(ext.name, e)) from e


setup(cmdclass={"build_ext": BuildExt})
