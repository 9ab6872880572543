-- acquire_shard: the lease hand-off. Optionally record the shard the caller just finished,
-- then (optionally) lease it the next one: one round trip per shard in a draining loop.
-- Completing records a shard as done, exactly once, for the holder of its current lease. A
-- stale token (the lease was taken back or re-granted) is refused, so a paused worker
-- cannot record a shard another worker now owns; repeating a successful completion with the
-- same token (a retry after a network error) succeeds without recording twice. Completing
-- does not ask for liveness: a lease not yet taken back is still its holder's.
-- Acquiring leases one shard of a (dataset, epoch) to a live worker: the first of its own
-- candidates still in the pool, else (if allowed) the pool's highest-priority shard
-- (stealing another worker's unstarted shard; the epoch meta's 'steals' counts these grants).
-- Before choosing, expired leases, and leases of workers that are no longer live (checked
-- once per membership generation), go back to the pool: at most 256 of each per call, a
-- sweep of more holders goes on over the next calls (its cursor in the epoch meta).
-- Every grant carries a new fencing token from a counter that never expires.
-- A completion also counts in the epoch meta (by:<worker>) and is kept as the worker's last
-- (last:<worker> = "<shard> <token>"): once init_epoch closed the epoch (its per-shard keys
-- gone), a retry of that completion still answers 0, and any other is refused. A closed
-- epoch leases nothing: acquiring answers A.NOTHING with every shard done.
-- KEYS[1] = epoch meta HASH   KEYS[2] = todo ZSET      KEYS[3] = holders HASH
-- KEYS[4] = expiry ZSET       KEYS[5] = done HASH      KEYS[6] = fence STRING
-- KEYS[7] = heartbeats ZSET   KEYS[8] = status HASH    KEYS[9] = generation STRING
-- KEYS[10] = offsets HASH (shard -> samples of it already trained: the grant starts there)
-- ARGV[1] = worker id   ARGV[2] = lease time-to-live, ms
-- ARGV[3] = "1" acquire, stealing if need be | "0" acquire own shards only | "" do not acquire
-- ARGV[4] = shard id to complete first, or "" for none   ARGV[5] = its fencing token
-- ARGV[6..] = the worker's own candidate shard ids, in its order
-- (S and A are the status prelude's tables: strata_redis/status.py)
-- returns, completing only: {S.OK, 1} recorded now | {S.OK, 0} already recorded with this
--       token | {S.LEASE_LOST}
-- returns, acquiring only: {S.OK, shard id, token, expires_ms, offset, candidates consumed}
--       | {S.OK, A.NOTHING, shards done, shards leased, candidates consumed}: nothing to lease
--       | {S.OK, A.NO_POOL}: the epoch was not initialized (call init_epoch first)
--       | {S.WORKER_NOT_REGISTERED} | {S.WORKER_FAILED} | {S.WORKER_LEFT}: only live workers
-- returns, both: {S.OK, completion, <acquire reply without its leading status>} where
--       completion is 1 recorded now | 0 already recorded | -1 lease lost; a worker that may
--       not lease gets {S.OK, completion, A.REFUSED, its status}
local id = ARGV[1]
local completion
if ARGV[4] ~= '' then
  local shard, token = ARGV[4], ARGV[5]
  local held = redis.call('HGET', KEYS[3], shard)
  if held and string.match(held, '^(%d+) ') == token then
    redis.call('HSET', KEYS[5], shard, token .. ' ' .. id)
    redis.call('HINCRBY', KEYS[1], 'by:' .. id, 1)
    redis.call('HSET', KEYS[1], 'last:' .. id, shard .. ' ' .. token)
    redis.call('HDEL', KEYS[3], shard)
    redis.call('ZREM', KEYS[4], shard)
    completion = 1
  else
    local done = redis.call('HGET', KEYS[5], shard)
    if done and string.match(done, '^(%d+) ') == token then
      completion = 0
    elseif redis.call('HGET', KEYS[1], 'last:' .. id) == shard .. ' ' .. token then
      completion = 0  -- a retry of this worker's last completion, in a closed epoch
    else
      completion = -1
    end
  end
  if ARGV[3] == '' then
    if completion < 0 then return {S.LEASE_LOST} end
    return {S.OK, completion}
  end
end

-- the acquire reply, with the completion outcome after the status when there was one
local function answer(reply)
  if completion == nil then return reply end
  if reply[1] ~= S.OK then return {S.OK, completion, A.REFUSED, reply[1]} end
  table.insert(reply, 2, completion)
  return reply
end

if not redis.call('ZSCORE', KEYS[7], id) then
  local status = redis.call('HGET', KEYS[8], id)
  if not status then return answer({S.WORKER_NOT_REGISTERED}) end
  if status == 'failed' then return answer({S.WORKER_FAILED}) end
  return answer({S.WORKER_LEFT})
end
local pool = redis.call('HMGET', KEYS[1], 'swept', 'closed_ms', 'num_shards')
if pool[2] then  -- closed (init_epoch): nothing of it is leased any more
  return answer({S.OK, A.NOTHING, tonumber(pool[3]), 0, NARGV - 5})
end
local swept = pool[1]
if not swept then return answer({S.OK, A.NO_POOL}) end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local function back_to_pool(shard)
  local held = redis.call('HGET', KEYS[3], shard)
  if held then
    local prio = string.match(held, '^%d+ %d+ (%S+) ')
    redis.call('ZADD', KEYS[2], prio, shard)
    redis.call('HDEL', KEYS[3], shard)
  end
  redis.call('ZREM', KEYS[4], shard)
end

-- bounded work per call (SWEEP leases at most): with 10^5 workers holding leases, expired
-- leases and a sweep after a membership change are spread over several acquires
local SWEEP = 256
for _, shard in ipairs(redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now, 'LIMIT', 0, SWEEP)) do
  back_to_pool(shard)
end
local gen = redis.call('GET', KEYS[9]) or '0'
if swept ~= gen then
  -- one HSCAN step of the holders; the cursor is kept until the sweep of this generation
  -- is through (a lease that is held throughout is looked at; one missed expires anyway)
  local at = redis.call('HMGET', KEYS[1], 'sweep_gen', 'sweep_cursor')
  local cursor = '0'
  if at[1] == gen then cursor = at[2] end
  local step = redis.call('HSCAN', KEYS[3], cursor, 'COUNT', SWEEP)
  local held = step[2]
  for i = 1, #held, 2 do
    local holder = string.match(held[i + 1], '^%d+ %d+ %S+ (.*)$')
    if not redis.call('ZSCORE', KEYS[7], holder) then back_to_pool(held[i]) end
  end
  if step[1] == '0' then
    redis.call('HSET', KEYS[1], 'swept', gen)
    redis.call('HDEL', KEYS[1], 'sweep_gen', 'sweep_cursor')
  else
    redis.call('HSET', KEYS[1], 'sweep_gen', gen, 'sweep_cursor', step[1])
  end
end

local pick, prio
local consumed = NARGV - 5
for i = 6, NARGV do
  prio = redis.call('ZSCORE', KEYS[2], ARGV[i])
  if prio then
    pick = ARGV[i]
    consumed = i - 5
    break
  end
end
if not pick and ARGV[3] == '1' then
  local top = redis.call('ZRANGE', KEYS[2], 0, 0, 'REV', 'WITHSCORES')
  if #top > 0 then
    pick, prio = top[1], top[2]
    redis.call('HINCRBY', KEYS[1], 'steals', 1)
  end
end
if not pick then
  return answer({S.OK, A.NOTHING, redis.call('HLEN', KEYS[5]), redis.call('HLEN', KEYS[3]), consumed})
end
redis.call('ZREM', KEYS[2], pick)
local token = redis.call('INCR', KEYS[6])
local expires = now + tonumber(ARGV[2])
redis.call('HSET', KEYS[3], pick, token .. ' ' .. expires .. ' ' .. prio .. ' ' .. id)
redis.call('ZADD', KEYS[4], expires, pick)
local offset = tonumber(redis.call('HGET', KEYS[10], pick) or '0')
return answer({S.OK, tonumber(pick), token, expires, offset, consumed})
