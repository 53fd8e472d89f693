"""Mix an OOD set with ID frames (e.g. Cityscapes val) into an evaluation set. Same as ``segood convert mix``."""

import sys

from segood.cli import main

if __name__ == "__main__":
    sys.exit(main(["convert", "mix", *sys.argv[1:]]))
