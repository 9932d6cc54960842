"""``python -m kernelbench``: the same CLI as the ``kernelbench`` console script."""

from kernelbench.cli import app

app(prog_name="kernelbench")
