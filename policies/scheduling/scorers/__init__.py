"""Scorers: rate each candidate in [0, 1], higher is better."""
