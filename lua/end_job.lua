-- end_job: the job is over (coordination/lifecycle.py: Job.end(), or the orchestrator's last
-- rank closing after its loop). Its record says "ended" and when its keys expire; the
-- record itself expires then, and the caller gives every other key of the job the same
-- expiry (expire_keys, in steps). Ending an ended job keeps its end (and its expiry).
-- KEYS[1] = job record HASH   KEYS[2] = heartbeats ZSET
-- ARGV[1] = retention, s      ARGV[2] = "1": end only if no worker is live, else "0"
-- ARGV[3] = heartbeat timeout, ms (recorded if the job has no record yet)
-- returns {0, expires_ms} | {0, 0}: not ended, workers are live (ARGV[2] = "1")
local r = redis.call('HMGET', KEYS[1], 'state', 'expires_ms')
if r[1] == 'ended' then return {S.OK, tonumber(r[2])} end
if ARGV[2] == '1' and redis.call('ZCARD', KEYS[2]) > 0 then return {S.OK, 0} end
local now = NOW_MS()
local expires = now + tonumber(ARGV[1]) * 1000
if not r[1] then
  redis.call('HSET', KEYS[1], 'created_ms', now, 'heartbeat_timeout_ms', ARGV[3])
end
redis.call('HSET', KEYS[1], 'state', 'ended', 'ended_ms', now, 'expires_ms', expires,
  'retention_s', ARGV[1])
redis.call('PEXPIREAT', KEYS[1], expires)
return {S.OK, expires}
