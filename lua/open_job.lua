-- open_job: a worker joins the job (coordination/lifecycle.py). The job's first registration
-- creates its record: created_ms, state "running", and the heartbeat timeout and retention
-- of the process that created it (readers judge staleness by that timeout). A job that was
-- ended is opened again: state "running", the registering process's timeout and retention;
-- the caller then clears the expiry the end gave the job's keys (persist_keys, in steps);
-- that expiry is kept as "reopened_from", so an end racing that walk moves what it missed.
-- KEYS[1] = job record HASH
-- ARGV[1] = heartbeat timeout, ms   ARGV[2] = retention once ended, s
-- returns {0, reopened (1 or 0), the job's heartbeat timeout ms, the end's expires_ms or ''}
local now = NOW_MS()
local r = redis.call('HMGET', KEYS[1], 'state', 'heartbeat_timeout_ms', 'expires_ms')
if not r[1] then
  redis.call('HSET', KEYS[1], 'created_ms', now, 'state', 'running',
    'heartbeat_timeout_ms', ARGV[1], 'retention_s', ARGV[2])
  return {S.OK, 0, ARGV[1], ''}
end
if r[1] == 'ended' then
  redis.call('HSET', KEYS[1], 'state', 'running', 'heartbeat_timeout_ms', ARGV[1],
    'retention_s', ARGV[2])
  redis.call('HDEL', KEYS[1], 'ended_ms', 'expires_ms')
  if r[3] then redis.call('HSET', KEYS[1], 'reopened_from', r[3]) end
  redis.call('HINCRBY', KEYS[1], 'reopened', 1)
  redis.call('PERSIST', KEYS[1])
  return {S.OK, 1, ARGV[1], r[3] or ''}
end
return {S.OK, 0, r[2] or ARGV[1], ''}
