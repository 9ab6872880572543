-- check_era: nothing but the era and clock check every script starts with (the prelude,
-- strata_redis/status.py): for a process that has raised its mark from elsewhere (a
-- checkpoint's clock, resume.py) and must know now whether Redis went back. It ticks the
-- clock like any call.
-- (no keys or arguments of its own)
-- returns {S.OK} | (the prelude's) STATE_LOST, STATE_ROLLED_BACK
return {S.OK}
