"""`python -m distrib.launch script.py`: torchrun with defaults for one machine (`distrib.launch.run.main`)."""
import sys
from .run import main

if __name__ == '__main__': sys.exit(main())
