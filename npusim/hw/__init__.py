"""Hardware configs: frozen, validated records loaded from hwconfigs/*.yaml."""

from npusim.hw.config import HwConfig
from npusim.hw.load import DEFAULT_HW, load_hw

__all__ = ["DEFAULT_HW", "HwConfig", "load_hw"]


def __getattr__(name: str):
    """npusim.hw.derived, npusim.hw.show, ...: imported on first use."""
    from npusim import submodule

    return submodule(__name__, name)
