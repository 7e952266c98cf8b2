"""Names of the student's options, importable without torch (the CLI registers them at start)."""

ARCHITECTURES: tuple[str, ...] = ("cnn", "cnn-hog", "cnn-hog-simclr", "mlp", "wn-mlp")
METHODS: tuple[str, ...] = ("vat", "gan", "supervised")
SELECTIONS: tuple[str, ...] = ("first", "random", "uncertainty")
