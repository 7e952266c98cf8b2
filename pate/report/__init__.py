"""Privacy-utility reports: figures, HTML and JSON."""
