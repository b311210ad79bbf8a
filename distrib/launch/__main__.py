"""`python -m distrib.launch script.py`: torchrun with defaults for one machine (`distrib.launch.cli.main`)."""
import sys
from .cli import main

if __name__ == '__main__': sys.exit(main())
