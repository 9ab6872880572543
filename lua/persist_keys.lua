-- persist_keys: one step of clearing the expiry an end gave a job's keys, after the job
-- was opened again (open_job; coordination/lifecycle.py walks the keys with SCAN). Only the
-- keys whose expiry is exactly the end's lose it: expiries of their own stay. Only while
-- the job is running: a job ended again meanwhile is left to that end.
-- KEYS[1] = job record HASH   KEYS[2..] = keys of the job (one SCAN step's)
-- ARGV[1] = the expires_ms the end had set
-- returns {0, keys whose expiry was cleared} | {0, -1}: the job is not running now
if redis.call('HGET', KEYS[1], 'state') ~= 'running' then return {S.OK, -1} end
local n = 0
for i = 2, NKEYS do
  if redis.call('PEXPIRETIME', KEYS[i]) == tonumber(ARGV[1]) then
    redis.call('PERSIST', KEYS[i])
    n = n + 1
  end
end
return {S.OK, n}
