"""``python -m pate`` is the ``pate`` command."""

import sys

from pate.cli import main

sys.exit(main())
