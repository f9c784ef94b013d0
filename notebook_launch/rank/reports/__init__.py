"""What a rank tells the notebook about itself: its bars (``progress``, the public ``progress()``), its pace in
collectives (``pace``), where it is even when blocked in C (``whereabouts``, ``where_thread``; over the
network for a rank on another machine: ``remote_where``) and, for such a rank, its own resources
(``resources``).

Owns: the rank's half of the panel's live columns and of hang diagnosis. May import: the rank's core tools
(``bootstrap``), channels, wire, record's formats, errors; never the notebook side or an engine.
"""
