"""A real S3 endpoint over HTTP on loopback: moto's server mode in its own process (the
launcher the fault run's S3 stand-in uses too)."""

from strata_redis.chaos.stand_in import MotoServer

__all__ = ["MotoServer"]
