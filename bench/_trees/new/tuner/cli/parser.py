"""The command line's parser class: argparse with the CLI's error line. A module of its own, importing nothing of
the tuner, so that any command's parser can use it: ``tuner.cli``'s and ``tuner native``'s (``tuner.native``,
which must not import the measuring code behind ``tuner.cli.args``)."""
from __future__ import annotations

import argparse


class Parser(argparse.ArgumentParser):
    """argparse with the CLI's error line: ``error: --seed must be an integer from 0 to 4294967295, got -1``
    (exit status 2, like a TunerError), then the command's usage. Subcommand parsers are of this class too."""

    def error(self, message: str):
        import re
        m = re.match(r"argument ([^/:\s]+)(?:/[^:\s]+)*: (.*)", message, re.S)
        if m:  # "argument --seed: must be ..." -> "--seed must be ..."; other messages keep a colon
            flag, rest = m.groups()
            message = f"{flag} {rest}" if rest.startswith("must ") else f"{flag}: {rest}"
        self.exit(2, f"error: {message}\n{self.format_usage()}")
