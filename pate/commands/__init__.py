"""One module per ``pate`` sub-command. Each exposes ``register(subparsers)``, which adds its parser
and sets ``handler`` to a function of the parsed arguments returning an exit code. Heavy imports
(torch, ray, the service) happen inside the handlers so that ``pate --help`` and ``pate analyze``
start fast."""
