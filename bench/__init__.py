"""Benchmarks: each prints ratios measured side by side in one run.

Run each as ``python -m bench.<name>``.
"""
