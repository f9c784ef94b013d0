"""Hang diagnosis, in one place (issue 31): asking ranks where they are (``ask_where``: their
where-thread, a signal only where the interpreter lock is held; ``stacks``: every rank of a run at
once; ``native_stacks``: py-spy and a rank's forked children), reading what they keep (``memfds``,
``faulthandler_dump``), the verdict (``hang_verdict``) and stall detection (``stall``)."""
