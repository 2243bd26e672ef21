"""`python -m bob`: the `bob` executable."""

from bob.cli.executable import entry

entry()
