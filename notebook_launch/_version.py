"""The package's version, in one place: pyproject.toml reads it at build time
(``[tool.setuptools.dynamic]``), ``notebook_launch.__version__`` re-exports it, and the wheel's metadata
(what ``notebook-launch --version`` and ``importlib.metadata`` report) is built from it."""

__version__ = "0.1.0"
