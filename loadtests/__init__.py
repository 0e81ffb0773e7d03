"""Workload generators, the load runner and the benchmark report."""
