"""Convert a raw sun tree into a segood HDF5 set. Same as ``segood convert sun``; ``--help`` for options."""

import sys

from segood.cli import main

if __name__ == "__main__":
    sys.exit(main(["convert", "sun", *sys.argv[1:]]))
