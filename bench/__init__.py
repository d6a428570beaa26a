"""Benchmarks (see BRIEF §Performance). Run each as ``python -m bench.<name>``."""
