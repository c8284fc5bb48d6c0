"""``python -m distdoctor``: the same command as ``distdoctor``."""

import sys

from distdoctor.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
