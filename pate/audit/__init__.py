"""Empirical privacy audits: the aggregators' noise and privacy loss measured against the
analytic bounds (``pate audit``)."""
