-- reap_workers: declare failed every worker whose last heartbeat (Redis' clock) is older
-- than the timeout. Atomic, so any number of processes may run it at once: each failure
-- is recorded once and moves the membership generation once.
-- Fair to a Redis stall (a slow command, a fork, SIGSTOP, a failover): when a stamped step
-- (one that says when it was sent) finds it waited too long to run, or that no stamped step
-- ran for too long, Redis was not running and live workers' heartbeats may be queued
-- behind it. Then, for one timeout (the grace), only workers already silent a timeout
-- before the stall began ("quiet") are declared failed; the others have time to beat.
-- Fair to an outage of Redis' writes (maxmemory reached under noeviction: heartbeats and
-- stamped steps are refused with OOM), too: a step never declares a failure while Redis
-- refuses writes, since its first write is one Redis refuses then (the reaper HASH; the
-- whole call fails, nothing done), and an unstamped step (``reap()``) that finds no stamped
-- step ran for too long and no grace began since is the first to see the outage end: it
-- begins the grace, from the last stamped step, like a stamped one.
-- KEYS[1] = heartbeats ZSET   KEYS[2] = status HASH   KEYS[3] = generation STRING
-- KEYS[4] = events STREAM     KEYS[5] = reaper HASH (last, quiet, grace, failed: ms)
-- KEYS[6] = failures STRING (workers declared failed over the job's life; +1 each)
-- ARGV[1] = heartbeat timeout, ms   ARGV[2] = events stream cap
-- ARGV[3] = at most this many workers per call (bounds the script's run time)
-- ARGV[4] = when the caller sent this call, ms on Redis' clock (its estimate), or ""
-- ARGV[5] = the most a stamped call may wait to run, ms; longer means a stall
-- ARGV[6] = the longest normal gap between two stamped calls, ms; longer means a stall
-- returns {0, generation, id...}: the ids newly declared failed
local now = NOW_MS()
local timeout = tonumber(ARGV[1])
local cutoff = now - timeout
local r = redis.call('HMGET', KEYS[5], 'last', 'quiet', 'grace')
local last, quiet, grace = tonumber(r[1]), tonumber(r[2]), tonumber(r[3] or '0')
local gap = last and now - last > tonumber(ARGV[6])
local function stalled(began)
  if now >= grace or not quiet then quiet = began else quiet = math.min(quiet, began) end
  grace = now + timeout
  redis.call('HSET', KEYS[5], 'quiet', quiet, 'grace', grace)
  redis.call('PEXPIRE', KEYS[5], 10 * timeout)
end
if ARGV[4] ~= '' then
  local sent = tonumber(ARGV[4])
  if now - sent > tonumber(ARGV[5]) or gap then stalled(math.min(sent, last or sent)) end
  redis.call('HSET', KEYS[5], 'last', now)
  redis.call('PEXPIRE', KEYS[5], 10 * timeout)
elseif gap and grace <= last then
  stalled(last)  -- no grace began since the last stamped step: this one begins it
end
if now < grace and quiet then cutoff = math.min(cutoff, quiet - timeout) end
local stale = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. cutoff,
  'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[3]))
local out = {S.OK, 0}
if #stale > 0 then
  -- a write Redis refuses at its memory limit, before any other: then nothing is declared
  redis.call('HSET', KEYS[5], 'failed', now)
  redis.call('PEXPIRE', KEYS[5], 10 * timeout)
end
for i = 1, #stale, 2 do
  local id = stale[i]
  redis.call('ZREM', KEYS[1], id)
  redis.call('HSET', KEYS[2], id, 'failed')
  redis.call('INCR', KEYS[6])
  local gen = redis.call('INCR', KEYS[3])
  redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[2], '*',
    'type', 'fail', 'worker', id, 'generation', gen, 'ms', now, 'last_seen_ms', stale[i + 1])
  out[#out + 1] = id
end
out[2] = tonumber(redis.call('GET', KEYS[3]) or '0')
return out
