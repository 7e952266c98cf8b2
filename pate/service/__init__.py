"""The aggregation service (HTTP) and its client."""
