"""The embedded benchmark: the whole pipeline on generated data in the real raw layouts.

Same as ``segood demo``; run ``python tools/demo.py --help`` for the options.
"""

import sys

from segood.cli import main

if __name__ == "__main__":
    sys.exit(main(["demo", *sys.argv[1:]]))
