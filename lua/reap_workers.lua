-- reap_workers: declare failed every worker whose last heartbeat (Redis' clock) is older
-- than the timeout. Atomic, so any number of processes may run it at once: each failure
-- is recorded once and moves the membership generation once.
-- KEYS[1] = heartbeats ZSET   KEYS[2] = status HASH   KEYS[3] = generation STRING
-- KEYS[4] = events STREAM
-- ARGV[1] = heartbeat timeout, ms   ARGV[2] = events stream cap
-- ARGV[3] = at most this many workers per call (bounds the script's run time)
-- returns {0, generation, id...}: the ids newly declared failed
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local stale = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. (now - tonumber(ARGV[1])),
  'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[3]))
local out = {S.OK, 0}
for i = 1, #stale, 2 do
  local id = stale[i]
  redis.call('ZREM', KEYS[1], id)
  redis.call('HSET', KEYS[2], id, 'failed')
  local gen = redis.call('INCR', KEYS[3])
  redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[2], '*',
    'type', 'fail', 'worker', id, 'generation', gen, 'ms', now, 'last_seen_ms', stale[i + 1])
  out[#out + 1] = id
end
out[2] = tonumber(redis.call('GET', KEYS[3]) or '0')
return out
