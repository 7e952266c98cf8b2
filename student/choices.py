"""Names of the student's options, importable without torch (the CLI registers them at start)."""

ARCHITECTURES: tuple[str, ...] = ("cnn", "cnn-hog", "cnn-hog-simclr", "mlp", "wn-mlp")
METHODS: tuple[str, ...] = ("vat", "gan", "supervised")
SELECTIONS: tuple[str, ...] = ("first", "random", "uncertainty")
# DP-SGD's networks (student.dpsgd.dpsgd_network): Papernot et al.'s tempered-sigmoid CNN, or a
# linear softmax on fixed HOG features (the ``hog`` teachers' network).
DPSGD_MODELS: tuple[str, ...] = ("tempered-cnn", "hog-linear")
