-- deregister_worker: a graceful leave. The worker's status becomes "left", it leaves the
-- heartbeat set, and the membership generation moves.
-- KEYS[1] = heartbeats ZSET   KEYS[2] = status HASH   KEYS[3] = incarnation HASH
-- KEYS[4] = generation STRING KEYS[5] = events STREAM
-- ARGV[1] = worker id   ARGV[2] = the caller's incarnation   ARGV[3] = events stream cap
-- returns {0, generation} | {1} NOT_REGISTERED | {3} FAILED | {4} LEFT | {6} REPLACED
local id = ARGV[1]
local status = redis.call('HGET', KEYS[2], id)
if not status then return {S.WORKER_NOT_REGISTERED} end
if status == 'failed' then return {S.WORKER_FAILED} end
if status == 'left' then return {S.WORKER_LEFT} end
if redis.call('HGET', KEYS[3], id) ~= ARGV[2] then return {S.WORKER_REPLACED} end
local now = NOW_MS()
redis.call('ZREM', KEYS[1], id)
redis.call('HSET', KEYS[2], id, 'left')
local gen = redis.call('INCR', KEYS[4])
redis.call('XADD', KEYS[5], 'MAXLEN', '~', ARGV[3], '*',
  'type', 'leave', 'worker', id, 'generation', gen, 'ms', now)
return {S.OK, gen}
