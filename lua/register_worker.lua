-- register_worker: a worker joins the job, or comes back after it failed or left.
-- Every registration bumps the membership generation; the new generation is the
-- worker's incarnation, which its later heartbeats must present.
-- A live registration of the id (its holder) is taken over ('replace', as replace=True
-- does: the holder's incarnation is superseded, so its heartbeats, rendezvous calls and
-- leave are refused with WORKER_REPLACED) when the caller asks to (ARGV[3]), or when the
-- holder is stale: its last heartbeat older than the timeout on Redis' clock (the cutoff
-- the reaper uses, its grace after a Redis stall included: reap_workers.lua), or its process
-- found gone by the caller on the caller's own host (ARGV[6] names the incarnation the caller
-- judged, so a holder that registered since is never taken by that verdict).
-- KEYS[1] = heartbeats ZSET   KEYS[2] = status HASH      KEYS[3] = incarnation HASH
-- KEYS[4] = info HASH         KEYS[5] = generation STRING KEYS[6] = events STREAM
-- KEYS[7] = reaper HASH (read only: 'quiet', 'grace': the reaper's grace after a stall)
-- ARGV[1] = worker id         ARGV[2] = info JSON
-- ARGV[3] = "1" to take over a live registration of the same id, else "0" (a stale one only)
-- ARGV[4] = events stream cap (approximate MAXLEN)
-- ARGV[5] = heartbeat timeout, ms: a holder silent for longer is stale
-- ARGV[6] = the holder's incarnation, when the caller found its process gone, else ""
-- returns {0, generation, now_ms, how}: how = 'join' (the id was free), 'asked' (ARGV[3]),
--         'gone' (ARGV[6]) or 'stale' (its heartbeat)
--       | {5, holder's info JSON or '', its incarnation or '', ms since its last heartbeat}
--         the id is registered and its holder alive (WORKER_EXISTS)
local now = NOW_MS()
local id = ARGV[1]
local status = redis.call('HGET', KEYS[2], id)
local live = status and status ~= 'failed' and status ~= 'left'
local how = 'join'
if live then
  how = 'asked'
  if ARGV[3] ~= '1' then
    local inc = redis.call('HGET', KEYS[3], id)
    if ARGV[6] ~= '' and ARGV[6] == inc then
      how = 'gone'
    else
      local timeout = tonumber(ARGV[5])
      local cutoff = now - timeout
      local r = redis.call('HMGET', KEYS[7], 'quiet', 'grace')
      local quiet, grace = tonumber(r[1]), tonumber(r[2])
      if quiet and grace and now < grace then cutoff = math.min(cutoff, quiet - timeout) end
      local seen = tonumber(redis.call('ZSCORE', KEYS[1], id))
      -- no heartbeat at all: nothing says the holder lives (the reaper never judges it)
      if seen and seen >= cutoff then
        return {S.WORKER_EXISTS, redis.call('HGET', KEYS[4], id) or '', inc or '', now - seen}
      end
      how = 'stale'
    end
  end
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
return {S.OK, gen, now, how}
