"""The parent side of a run: watch the ranks' fds (``watch``), decide what each end
means (``outcome``), and drive both, stopping everything on the first failure (``supervisor``)."""
