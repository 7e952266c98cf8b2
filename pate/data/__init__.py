"""Datasets: built-in benchmarks, the synthetic glyphs, augmentation, votes files."""
