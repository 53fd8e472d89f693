"""Convert a raw idd tree into a segood HDF5 set. Same as ``segood convert idd``; ``--help`` for options."""

import sys

from segood.cli import main

if __name__ == "__main__":
    sys.exit(main(["convert", "idd", *sys.argv[1:]]))
