"""What a run keeps: its state folded from the ranks' events, the logs and run folders, the metrics, each rank's
resources (from /proc and NVML) and which rank holds the others back (``slow_rank``).

Owns: the data the panel draws and the files a run leaves. May import: wire, notebook, errors; never the
supervisor or a launcher.
"""
