"""The fault checker: real worker processes under a fault schedule drawn from a seed, a
recorded history, and a checker of the whole history (``python -m strata_redis.chaos``)."""
