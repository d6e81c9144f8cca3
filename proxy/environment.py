"""Flags from the environment: every flag ``--some-flag`` of the ``warmwatch`` commands can be
set by the variable ``WARMWATCH_SOME_FLAG``; the flag on the command line wins.

A variable is read as that flag's argument would be, and refused as it would be: a number
that does not parse (an empty one included) ends the command with the variable's name and
exit code 2, never as some other value. An empty variable is an empty argument, which only
flags that give it a meaning accept (``--reject-paths``: allow every path).
"""

from __future__ import annotations

import os


def variable(flag: str) -> str:
    """``--metrics-listen`` (or ``metrics-listen``) -> ``WARMWATCH_METRICS_LISTEN``."""
    return "WARMWATCH_" + flag.removeprefix("--").upper().replace("-", "_")


def env(flag: str, default: str | None = None) -> str | None:
    """The flag's variable, else ``default`` when it is not set."""
    return os.environ.get(variable(flag), default)
