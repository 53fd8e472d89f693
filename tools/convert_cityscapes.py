"""Convert a raw cityscapes tree into a segood HDF5 set. Same as ``segood convert cityscapes``; ``--help`` for options."""

import sys

from segood.cli import main

if __name__ == "__main__":
    sys.exit(main(["convert", "cityscapes", *sys.argv[1:]]))
