"""python -m analysis.experiments NAME ...: see analysis.experiments."""

import sys

from . import main

sys.exit(main())
