"""PATE: Private Aggregation of Teacher Ensembles (Papernot et al. 2017, 2018)."""

__version__ = "0.1.0"
