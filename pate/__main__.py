"""``python -m pate`` is the ``pate`` command."""

import sys

from pate.cli.main import main

sys.exit(main())
