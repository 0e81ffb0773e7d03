"""Pickers: order every remaining candidate best first."""
