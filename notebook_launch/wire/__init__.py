"""What both sides read: the plan (who runs where, with which environment), the rank -> notebook events
(``protocol``), tensors through memfds (``shared_tensors``; its pickler's reducers
in ``tensor_reducers``, the memfd in ``tensor_file``), what may be pickled (``pickling``), whole lines
from bytes, locks renewed in forked children and which errors are allocation failures.

Owns: the formats that cross a process boundary. May import: channels and itself only (the bottom of the
graph).
"""
