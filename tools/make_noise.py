"""Generate a Perlin or random normal noise set (every pixel OOD). Same as ``segood convert noise``."""

import sys

from segood.cli import main

if __name__ == "__main__":
    sys.exit(main(["convert", "noise", *sys.argv[1:]]))
