-- heartbeat: record that a worker is alive (score = Redis' clock), optionally with a new status.
-- A worker that was declared failed, left, or was replaced by a newer registration of
-- its id is refused: old heartbeats never resurrect it.
-- KEYS[1] = heartbeats ZSET   KEYS[2] = status HASH   KEYS[3] = incarnation HASH
-- ARGV[1] = worker id   ARGV[2] = the caller's incarnation
-- ARGV[3] = new status (idle | training | checkpointing) or "" to keep it
-- returns {0, now_ms} | {1} NOT_REGISTERED | {3} FAILED | {4} LEFT | {6} REPLACED
--       | {S.STATE_LOST, era marked lost}: a live worker (by its status) has no heartbeat:
--         the heartbeats ZSET was lost (every script that ends a worker's heartbeat sets its
--         status failed or left), so the failure detector cannot be trusted (G.ANCHORS)
local id = ARGV[1]
local status = redis.call('HGET', KEYS[2], id)
if not status then return {S.WORKER_NOT_REGISTERED} end
if status == 'failed' then return {S.WORKER_FAILED} end
if status == 'left' then return {S.WORKER_LEFT} end
if redis.call('HGET', KEYS[3], id) ~= ARGV[2] then return {S.WORKER_REPLACED} end
if G.ANCHORS and not redis.call('ZSCORE', KEYS[1], id) then return LOST(KEYS[1]) end
local now = NOW_MS()
redis.call('ZADD', KEYS[1], now, id)
if ARGV[3] ~= '' then redis.call('HSET', KEYS[2], id, ARGV[3]) end
return {S.OK, now}
