"""What runs inside a rank. This folder is the rank's core: the start and end of every rank process
(``bootstrap``), the entry points of a forked and a spawned rank (``fork_entry``, ``spawn_entry``,
``spawn_context``), what runs the user's function and reports it (``runner``, ``result_pickle``), a
persistent rank's loop and namespace (``serve``, ``namespace``), the warm forkers' shared loop and imports
(``forking``, ``preload``, ``device_backends``), and the tools every in-rank patch uses (``after_import``,
``inherited_streams``). Below it, what the core installs or calls by name (``installs``: a table of module
names it resolves with importlib, never an import): ``integrations`` (tqdm, rich, Transformers, Lightning,
IPython's display), ``reports`` (bars, pace, where the rank is, its resources), ``group`` (joining and
leaving a process group) and ``batch`` (``find_executable_batch_size``). The stdin relay stays here: its
``StdinUnavailableError`` is documented at ``notebook_launch.rank.stdin_relay``.

Owns: everything that runs inside a rank. May import: wire, channels, record's formats, detect, errors; its
sub-packages import the core's tools, the core reaches them only through ``installs``; never the notebook
side (launchers, the supervisor, the run scaffold, the API) nor an engine.
"""
