"""Helpers shared by the tests (never shipped in the package: notebook_launch holds nothing
that only tests use)."""
