"""``python -m ifrtpy``: the command line (:mod:`ifrtpy.cli`)."""

import sys

from ifrtpy.cli import main

if __name__ == "__main__":
    sys.exit(main())
