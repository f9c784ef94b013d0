"""Inside a rank, the integrations with other libraries: the bars tqdm, rich and the Transformers Trainer draw
become panel bars (``progress_bridge`` and one adapter per library), Lightning's process-starting strategies
join the launched ranks (``lightning_strategy``), and IPython's display() reaches the cell
(``display_relay``). The runner installs them by name (``rank.installs``), never by import.

Owns: patching other libraries inside a rank. May import: the rank's core tools (``after_import``,
``inherited_streams``), ``rank.reports`` (panel bars), wire, errors; never the rank's runner, the notebook
side or an engine.
"""
