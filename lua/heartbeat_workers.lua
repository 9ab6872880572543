-- heartbeat_workers: record that several workers of one process are alive, in one call (one
-- ZADD, score = Redis' clock). Each worker is judged as ``heartbeat`` judges one: a worker
-- that was declared failed, left, or was replaced by a newer registration of its id is
-- refused and reported, never resurrected. Statuses are kept (``heartbeat`` sets them).
-- The caller bounds the batch (``workers.HEARTBEAT_BATCH``).
-- KEYS[1] = heartbeats ZSET   KEYS[2] = status HASH   KEYS[3] = incarnation HASH
-- ARGV[1..n] = the workers' ids   ARGV[n+1..2n] = the caller's incarnation of each, in order
-- returns {0, now_ms, code_1, ..., code_n}: code_i is worker i's Status: OK (heartbeat
-- recorded) | NOT_REGISTERED | FAILED | LEFT | REPLACED (nothing written for it)
--       | {S.STATE_LOST, era marked lost}: live workers and no heartbeats ZSET: it was lost
--         (G.ANCHORS; heartbeat checks each worker's entry, this the key: one EXISTS)
local n = math.floor(NARGV / 2)
local now = NOW_MS()
local reply = {S.OK, now}
if n == 0 then return reply end
local statuses = redis.call('HMGET', KEYS[2], unpack(ARGV, 1, n))
local incarnations = redis.call('HMGET', KEYS[3], unpack(ARGV, 1, n))
-- one number-to-string conversion, not one per worker; a counter, not a length per insert
local beats, b, score = {}, 0, tostring(now)
for i = 1, n do
  local status, code = statuses[i], S.OK
  if not status then code = S.WORKER_NOT_REGISTERED
  elseif status == 'failed' then code = S.WORKER_FAILED
  elseif status == 'left' then code = S.WORKER_LEFT
  elseif incarnations[i] ~= ARGV[n + i] then code = S.WORKER_REPLACED
  else
    beats[b + 1], beats[b + 2], b = score, ARGV[i], b + 2
  end
  reply[i + 2] = code
end
if b > 0 then
  if G.ANCHORS and redis.call('EXISTS', KEYS[1]) == 0 then return LOST(KEYS[1]) end
  redis.call('ZADD', KEYS[1], unpack(beats, 1, b))
end
return reply
