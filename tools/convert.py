"""Convert a raw dataset into a segood HDF5 set: ``tools/convert.py DATASET ROOT --out X.h5``.

Same as ``segood convert DATASET``; DATASET is any registered adapter (``--help`` lists them, with their
options: ``tools/convert.py sun --help``).
"""

import sys

from segood.cli import main

if __name__ == "__main__":
    sys.exit(main(["convert", *sys.argv[1:]]))
