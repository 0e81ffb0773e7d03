"""Filters: drop candidates that cannot serve a request (hard) or should not (soft)."""
