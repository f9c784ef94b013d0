"""The IPython magics: ``%%launch`` (``launch``), ``%ranks`` and ``%%ranks`` (``ranks``), and what both parse
alike (``options``).

Owns: the magics' syntax. May import: the public API (``launcher``, ``ranks``), ``hooks``, ``engines`` (the
cluster types), persistent, the rank's namespace, errors.
"""
