"""The user's call and what it may run on: the launch options (checked once, frozen), the target (what a launch
runs on here), the file-descriptor budget, this node's network and who holds a port.

Owns: checking what a launch asks before anything starts. May import: errors, wire, detect, display's words
and constants, diagnosis's defaults; never a launcher, the supervisor or the run state.
"""
