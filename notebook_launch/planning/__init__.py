"""The user's call and what it may run on: the launch options (checked once, frozen), the target (what a launch
runs on here), the guards that refuse a notebook state before anything starts (``preflight``), the preparation
every entry point goes through (``prepare``: its arguments to options, then guards, target, port and plan), the
file-descriptor budget, this node's network and who holds a port.

Owns: checking what a launch asks before anything starts. May import: errors, wire, detect, notebook's facts
(CUDA, Accelerate, what installed the hooks), record (the run id), process (the start note and the keeper),
display's words and constants, diagnosis's defaults; never an engine, the hooks, the supervisor or the run state.
"""
