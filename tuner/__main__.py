"""`python -m tuner` runs the CLI."""

import sys

from tuner.cli import main

sys.exit(main())
