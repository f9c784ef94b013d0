"""What a run keeps: its state folded from the ranks' events, the logs and run folders, the metrics, each rank's
resources (from /proc and NVML), which rank holds the others back (``slow_rank``) and the prefix that tags
each rank's lines (``line_prefix``: the option's syntaxes are checked there, once, before anything starts).

Owns: the data the panel draws and the files a run leaves. May import: wire, notebook, errors; never the
supervisor or a launcher.
"""
