"""Benchmarks for notebook_launch: one command, one markdown table (see run.py)."""
