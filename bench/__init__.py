"""Benchmarks of the SQLite transport against the SQLite floor, the seed design and peers.

Run ``python -m bench`` (``--quick`` for a smoke run of a few seconds); see
docs/performance.md. Nothing here is imported by the library.
"""
