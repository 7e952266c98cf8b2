"""Aggregation: the noisy aggregators, the durable privacy ledger, and the label service that
answers a student's requests with them (independent of any transport)."""
