"""``python -m tuner.cli`` runs the CLI, as ``python -m tuner`` does."""

from tuner.cli import run

run()
