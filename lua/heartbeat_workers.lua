-- heartbeat_workers: record that several workers of one process are alive, in one call (one
-- ZADD, score = Redis' clock). Each worker is judged as ``heartbeat`` judges one: a worker
-- that was declared failed, left, or was replaced by a newer registration of its id is
-- refused and reported, never resurrected. Statuses are kept (``heartbeat`` sets them).
-- The caller bounds the batch (``workers.HEARTBEAT_BATCH``).
-- KEYS[1] = heartbeats ZSET   KEYS[2] = status HASH   KEYS[3] = incarnation HASH
-- ARGV[2i-1] = worker i's id   ARGV[2i] = the caller's incarnation of it   (i = 1 .. n)
-- returns {0, now_ms, code_1, ..., code_n}: code_i is worker i's Status: OK (heartbeat
-- recorded) | NOT_REGISTERED | FAILED | LEFT | REPLACED (nothing written for it)
local n = math.floor(NARGV / 2)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local reply = {S.OK, now}
if n == 0 then return reply end
local ids = {}
for i = 1, n do ids[i] = ARGV[2 * i - 1] end
local statuses = redis.call('HMGET', KEYS[2], unpack(ids))
local incarnations = redis.call('HMGET', KEYS[3], unpack(ids))
local beats, score = {}, tostring(now)  -- one number-to-string conversion, not one per worker
for i = 1, n do
  local status, code = statuses[i], S.OK
  if not status then code = S.WORKER_NOT_REGISTERED
  elseif status == 'failed' then code = S.WORKER_FAILED
  elseif status == 'left' then code = S.WORKER_LEFT
  elseif incarnations[i] ~= ARGV[2 * i] then code = S.WORKER_REPLACED
  else
    beats[#beats + 1] = score
    beats[#beats + 1] = ids[i]
  end
  reply[i + 2] = code
end
if #beats > 0 then redis.call('ZADD', KEYS[1], unpack(beats)) end
return reply
