-- register_worker: a worker joins the job, or comes back after it failed or left.
-- Every registration bumps the membership generation; the new generation is the
-- worker's incarnation, which its later heartbeats must present.
-- KEYS[1] = heartbeats ZSET   KEYS[2] = status HASH      KEYS[3] = incarnation HASH
-- KEYS[4] = info HASH         KEYS[5] = generation STRING KEYS[6] = events STREAM
-- ARGV[1] = worker id         ARGV[2] = info JSON
-- ARGV[3] = "1" to take over a live registration of the same id, else "0"
-- ARGV[4] = events stream cap (approximate MAXLEN)
-- returns {0, generation, now_ms}
--       | {5, holder's info JSON or ''} the id is registered and alive (WORKER_EXISTS)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local id = ARGV[1]
local status = redis.call('HGET', KEYS[2], id)
local live = status and status ~= 'failed' and status ~= 'left'
if live and ARGV[3] ~= '1' then
  return {S.WORKER_EXISTS, redis.call('HGET', KEYS[4], id) or ''}
end
local gen = redis.call('INCR', KEYS[5])
redis.call('ZADD', KEYS[1], now, id)
redis.call('HSET', KEYS[2], id, 'idle')
redis.call('HSET', KEYS[3], id, gen)
redis.call('HSET', KEYS[4], id, ARGV[2])
local kind = 'join'
if live then kind = 'replace' end
redis.call('XADD', KEYS[6], 'MAXLEN', '~', ARGV[4], '*',
  'type', kind, 'worker', id, 'generation', gen, 'ms', now)
return {S.OK, gen, now}
