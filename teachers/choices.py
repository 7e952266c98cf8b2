"""Names of the teachers' architectures, importable without torch (the CLI registers them at
start); ``teachers.models.ARCHITECTURES`` builds them."""

MODELS: tuple[str, ...] = ("cnn", "cnn-pool", "resnet", "mlp", "cnn-pool-hog",
                          "cnn-pool-hog-simclr")
