"""The format of asking a rank where it is (issue 31), which both sides use: the notebook writes
a request to a rank's wake pipe (``diagnose.where_thread``), the rank's where-thread answers in
its answers memfd (``rank.reports.where_thread``). Here so that neither side reads the other's module
for it.

A request: ``REQUEST``, the request's id, written to the wake pipe. The answers memfd (named
``ANSWERS_NAME``): ``ANSWER_HEAD`` (generation, text length, the wake pipe's write fd, the
where-thread's OS thread id) then, from ``ANSWER_TEXT``, the text. The generation is odd while
an answer is being written (the reader retries: a seqlock). The text's first line is
``ANSWER_LINE`` and the ids of the latest answered requests (``RECENT`` of them: a reader that
comes late still finds its id in a newer answer, which is at least as fresh as the one it asked
for); the stacks follow, in faulthandler's text format.
"""
from __future__ import annotations

import struct

ANSWERS_NAME = "notebook_launch-answers"
ANSWER_HEAD = struct.Struct("<QQii")     # generation, text length, wake pipe's write fd, the thread's tid
ANSWER_TEXT = 32                         # where the text starts
REQUEST = struct.Struct("<Q")            # a request: its id
ANSWER_LINE = "notebook_launch where answer:"   # the text's first line: this, then the ids answered
RECENT = 64                              # ids each answer lists
