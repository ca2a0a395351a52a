"""`python -m studies.recipes STEP ...`."""

import sys

from studies.recipes.cli import main

if __name__ == "__main__":
    sys.exit(main())
