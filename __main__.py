"""`python -m kbench`: the same front door as the `kbench` console script."""
from .cli import main

main()
