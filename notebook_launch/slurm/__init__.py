"""Kept so that documented module paths under ``notebook_launch.slurm`` work: the modules moved (CHANGELOG.md)."""
