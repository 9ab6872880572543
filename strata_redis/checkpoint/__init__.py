"""Checkpoints: the save pipeline, all-or-nothing commit, index, verified reads, retention."""
