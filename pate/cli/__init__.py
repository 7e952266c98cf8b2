"""The ``pate`` command line: one module per sub-command."""
