"""Same as ``segood train``; ``--help`` for options (see tools/README.md)."""

import sys

from segood.cli import main

if __name__ == "__main__":
    sys.exit(main(["train", *sys.argv[1:]]))
