"""What the notebook's own process holds: whether CUDA was initialized in it, who made an Accelerate state, and
its own standard streams.

Owns: facts about the notebook's process. May import: errors, detect.
"""
