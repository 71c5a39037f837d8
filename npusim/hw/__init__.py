"""Hardware configs: frozen, validated records loaded from hwconfigs/*.yaml."""

from npusim.hw.config import HwConfig
from npusim.hw.load import DEFAULT_HW, load_hw

__all__ = ["DEFAULT_HW", "HwConfig", "load_hw"]
