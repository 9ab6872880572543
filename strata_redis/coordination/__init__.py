"""Coordination features: the worker registry, workers, barriers, epochs, barrier latency."""
