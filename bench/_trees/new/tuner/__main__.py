"""`python -m tuner` runs the CLI."""

import sys

from tuner.cli import run

run()
