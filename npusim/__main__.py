import sys

from npusim.cli import program

sys.exit(program())
