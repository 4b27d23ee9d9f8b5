"""``python -m stepstone.cli``."""

from stepstone.cli import main

main()
