"""`python -m transientvod.cli`: the `transientvod` command."""
from transientvod.cli import console_main

console_main()
