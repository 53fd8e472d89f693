"""Same as ``segood evaluate``; ``--help`` for options (see tools/README.md)."""

import sys

from segood.cli import main

if __name__ == "__main__":
    sys.exit(main(["evaluate", *sys.argv[1:]]))
