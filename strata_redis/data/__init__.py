"""Data features: shard ranges and shuffling, consistent hashing, the dataset registry, leases."""
