"""``python -m packkit``: the command line of :mod:`packkit.tools.cli`."""
import sys

from .tools.cli import main

if __name__ == "__main__":
    sys.exit(main())
