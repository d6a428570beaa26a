"""Benchmarks: each prints ratios measured side by side in one run. Run as ``python -m bench.<name>``."""
