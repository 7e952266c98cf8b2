"""Aggregation: the noisy aggregators and the durable privacy ledger."""
