"""python -m analysis.experiments NAME ...: see analysis.experiments."""

import sys

from . import main

if __name__ == "__main__":  # not when a spawned worker process imports this module as __mp_main__
    sys.exit(main())
