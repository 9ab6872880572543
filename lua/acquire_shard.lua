-- acquire_shard: the lease hand-off. Optionally record the shard the caller just finished,
-- then (optionally) lease it the next one: one round trip per shard in a draining loop.
-- Completing records a shard as done, exactly once, for the holder of its current lease:
-- the completion names the grant it ends (its token and the grant id the acquiring call sent,
-- random: no rollback of the token counter can issue that pair twice). Another grant (the
-- lease was taken back or re-granted, or a token number issued again after a rollback) is
-- refused, so a paused worker cannot record a shard another worker now owns; repeating a
-- successful completion of the same grant (a retry after a network error) succeeds without
-- recording twice. Completing does not ask for liveness: a lease not yet taken back is
-- still its holder's.
-- The record: the done bitmap (bit = shard), and per shard in the record segment of its id
-- (SEG shards a segment: strata_redis.data.leases.RECORD_SEGMENT; created whole, zeros, by
-- its first completion) a BITFIELD of 96 bits: the completion's token (i64) and the
-- completer's index (u32) in the epoch's workers HASH (n, w:<worker>, i:<index>). A completion also counts in the meta (done, by:<worker>)
-- and is kept as the worker's last (last:<worker> = "<shard> <token> <grant>"), and the
-- samples it trained (ARGV[6]) count in the dataset's lifetime totals (KEYS[13]: samples, w:<worker>,
-- never reset; a retry records nothing twice): once init_epoch
-- closed the epoch (its per-shard keys gone), a retry of that completion still answers 0,
-- and any other is refused. A closed epoch leases nothing: acquiring answers A.NOTHING with
-- every shard done.
-- Acquiring leases one shard of a (dataset, epoch) to a live worker: the first of its own
-- candidates still in the pool (bit 0 in the taken bitmap), else (if allowed) the first free
-- shard from the meta's rotating `cursor` on (BITPOS; wrapping round to 0): stealing another
-- worker's unstarted shard; the epoch meta's 'steals' counts these grants, and the dataset's
-- lifetime totals' 'steals' too (it never resets at a new epoch).
-- Before choosing, expired leases, and leases of workers that are no longer live (checked
-- once per membership generation), go back to the pool: at most 256 of each per call, a
-- sweep of more holders goes on over the next calls (its cursor in the epoch meta).
-- Every grant carries a new fencing token from a counter that never expires.
-- The epoch's structure stands whole while its pool is open, or the call changes nothing
-- and answers S.STATE_LOST naming the key that is gone (LOST, status.py; G.ANCHORS): the
-- taken and done bitmaps exist, the holders and expiry hold as many shards (every script
-- writes both), the offsets exist once written (meta `offsets`), the restored offsets once
-- a restore wrote them (meta `restored`: every member's data position carries them), the
-- workers once indexed (meta `indexed`), a record segment once made (meta `seg:<k>`), and the meta exists while
-- either bitmap does (an operator's DEL, an eviction: a pool rebuilt from nothing, or a
-- taken bitmap gone, would hand out shards already trained).
-- KEYS[1] = epoch meta HASH   KEYS[2] = taken STRING (bitmap)   KEYS[3] = holders HASH
-- KEYS[4] = expiry ZSET       KEYS[5] = done STRING (bitmap)    KEYS[6] = fence STRING
-- KEYS[7] = heartbeats ZSET   KEYS[8] = status HASH    KEYS[9] = generation STRING
-- KEYS[10] = offsets HASH (shard -> samples of it already trained: the grant starts there)
-- KEYS[11] = the record segment STRING of the shard to complete (any segment when none)
-- KEYS[12] = workers HASH (the epoch's completers, indexed for the record)
-- KEYS[13] = the dataset's lease totals HASH (lifetime: steals, samples, w:<worker>)
-- KEYS[14] = restored HASH (the offsets a checkpoint restore wrote: only checked here)
-- (the holders HASH: shard -> "<token> <expires_ms> <grant id> <worker>")
-- ARGV[1] = worker id   ARGV[2] = lease time-to-live, ms
-- ARGV[3] = "1" acquire, stealing if need be | "0" acquire own shards only | "" do not acquire
-- ARGV[4] = shard id to complete first, or "" for none   ARGV[5] = its fencing token
-- ARGV[6] = samples of that shard the caller trained (its length less its lease's start), or ""
-- ARGV[7] = the grant id of the lease to complete ("" when none)
-- ARGV[8] = the grant id for the lease this call grants (16 random hex digits, no spaces)
-- ARGV[9..] = the worker's own candidate shard ids, in its order
-- (S.* and A.* are status codes, written in as numbers when the script loads:
-- strata_redis/status.py, status.inline)
-- returns, completing only: {S.OK, 1} recorded now | {S.OK, 0} already recorded with this
--       token | {S.LEASE_LOST}
-- returns, acquiring only: {S.OK, shard id, token, expires_ms, offset, candidates consumed}
--       | {S.OK, A.NOTHING, shards done, shards leased, candidates consumed}: nothing to lease
--       | {S.OK, A.NO_POOL}: the epoch was not initialized (call init_epoch first)
--       | {S.WORKER_NOT_REGISTERED} | {S.WORKER_FAILED} | {S.WORKER_LEFT}: only live workers
-- returns, any: {S.STATE_LOST, era marked lost}: a key of the epoch's structure, or the live
--       worker's heartbeat, is gone
-- returns, both: {S.OK, completion, <acquire reply without its leading status>} where
--       completion is 1 recorded now | 0 already recorded | -1 lease lost; a worker that may
--       not lease gets {S.OK, completion, A.REFUSED, its status}
local SEG = 65535
local id = ARGV[1]
-- a live worker's heartbeat (every script that ends it sets its status failed or left): a
-- status that says live with none means the heartbeats ZSET was lost
local beat = redis.call('ZSCORE', KEYS[7], id)
if G.ANCHORS and not beat then
  local status = redis.call('HGET', KEYS[8], id)
  if status and status ~= 'failed' and status ~= 'left' then return LOST(KEYS[7]) end
end
local pool = redis.call('HMGET', KEYS[1], 'swept', 'closed_ms', 'num_shards', 'cursor',
  'offsets', 'indexed', 'restored')
if G.ANCHORS and not pool[2] then
  if pool[1] then  -- open: its bitmaps, holders and expiry, offsets once written
    if redis.call('EXISTS', KEYS[2], KEYS[5]) < 2 then
      if redis.call('EXISTS', KEYS[2]) == 0 then return LOST(KEYS[2]) end
      return LOST(KEYS[5])
    end
    local held, expiring = redis.call('HLEN', KEYS[3]), redis.call('ZCARD', KEYS[4])
    if held ~= expiring then
      if held < expiring then return LOST(KEYS[3]) end
      return LOST(KEYS[4])
    end
    if pool[5] and redis.call('EXISTS', KEYS[10]) == 0 then return LOST(KEYS[10]) end
    if pool[7] and redis.call('EXISTS', KEYS[14]) == 0 then return LOST(KEYS[14]) end
  elseif redis.call('EXISTS', KEYS[1]) == 0 and redis.call('EXISTS', KEYS[2], KEYS[5]) > 0 then
    return LOST(KEYS[1])  -- its bitmaps stand without it
  end
end
local completion
if ARGV[4] ~= '' then
  local shard, token, grant = ARGV[4], ARGV[5], ARGV[7]
  local n = tonumber(shard)
  local at = (n % SEG) * 96
  local held = redis.call('HGET', KEYS[3], shard)
  local held_token, held_grant
  if held then held_token, held_grant = string.match(held, '^(%d+) %d+ (%S+) ') end
  -- the shard's record segment, once made (meta seg:<k>), stands: recording and a retry's
  -- check both read it
  local segment = 'seg:' .. math.floor(n / SEG)
  local made = redis.call('EXISTS', KEYS[11]) == 1
  if not made and G.ANCHORS and redis.call('HEXISTS', KEYS[1], segment) == 1 then
    return LOST(KEYS[11])
  end
  -- G.FENCING off (the fault checker's proof that it matters only): every completion records
  if (held and held_token == token and held_grant == grant) or not G.FENCING then
    local index = redis.call('HGET', KEYS[12], 'w:' .. id)
    if not index then
      if G.ANCHORS and pool[6] and redis.call('EXISTS', KEYS[12]) == 0 then
        return LOST(KEYS[12])
      end
      index = redis.call('HINCRBY', KEYS[12], 'n', 1)
      redis.call('HSET', KEYS[12], 'w:' .. id, index, 'i:' .. index, id)
      if not pool[6] then redis.call('HSET', KEYS[1], 'indexed', 1) end
    end
    if not made then
      -- the segment at its size at once (written in place from then on: a string grown by
      -- BITFIELD writes past its end is given up to twice the room)
      local total = tonumber(redis.call('HGET', KEYS[1], 'num_shards'))
      redis.call('SETRANGE', KEYS[11], math.min(SEG, total - (n - n % SEG)) * 12 - 1, '\0')
      redis.call('HSET', KEYS[1], segment, 1)
    end
    redis.call('BITFIELD', KEYS[11], 'SET', 'i64', at, token, 'SET', 'u32', at + 64, index)
    redis.call('SETBIT', KEYS[5], n, 1)
    redis.call('HINCRBY', KEYS[1], 'done', 1)
    redis.call('HINCRBY', KEYS[1], 'by:' .. id, 1)
    redis.call('HSET', KEYS[1], 'last:' .. id, shard .. ' ' .. token .. ' ' .. grant)
    local samples = tonumber(ARGV[6]) or 0
    if samples > 0 then
      redis.call('HINCRBY', KEYS[13], 'samples', samples)
      redis.call('HINCRBY', KEYS[13], 'w:' .. id, samples)
    end
    redis.call('HDEL', KEYS[3], shard)
    redis.call('ZREM', KEYS[4], shard)
    completion = 1
  else
    completion = -1
    if redis.call('GETBIT', KEYS[5], n) == 1 then
      -- a retry of a recorded completion: the same token, completed by this worker
      local got = redis.call('BITFIELD', KEYS[11], 'GET', 'i64', at, 'GET', 'u32', at + 64)
      if got[1] == tonumber(token) and tostring(got[2]) == redis.call('HGET', KEYS[12], 'w:' .. id) then
        completion = 0
      end
    end
    local last = shard .. ' ' .. token .. ' ' .. grant
    if completion < 0 and redis.call('HGET', KEYS[1], 'last:' .. id) == last then
      completion = 0  -- a retry of this worker's last completion (in a closed epoch too)
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

if not beat then
  local status = redis.call('HGET', KEYS[8], id)
  if not status then return answer({S.WORKER_NOT_REGISTERED}) end
  if status == 'failed' then return answer({S.WORKER_FAILED}) end
  return answer({S.WORKER_LEFT})
end
if pool[2] then  -- closed (init_epoch): nothing of it is leased any more
  return answer({S.OK, A.NOTHING, tonumber(pool[3]), 0, NARGV - 8})
end
local swept = pool[1]
if not swept then return answer({S.OK, A.NO_POOL}) end
local now = NOW_MS()

local function back_to_pool(shard)
  if redis.call('HDEL', KEYS[3], shard) == 1 then
    redis.call('SETBIT', KEYS[2], tonumber(shard), 0)
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

local pick
local consumed = NARGV - 8
for i = 9, NARGV do
  if redis.call('GETBIT', KEYS[2], tonumber(ARGV[i])) == 0 then
    pick = tonumber(ARGV[i])
    consumed = i - 8
    break
  end
end
if not pick and ARGV[3] == '1' then
  -- the first free shard from the cursor on (a missing bit is 0: free; BITPOS answers the
  -- first bit past the string when every bit from `start` is set), else from shard 0
  local total = tonumber(pool[3])
  local p = redis.call('BITPOS', KEYS[2], 0, math.floor(tonumber(pool[4] or '0') / 8))
  if p < 0 or p >= total then p = redis.call('BITPOS', KEYS[2], 0, 0) end
  if p >= 0 and p < total then
    pick = p
    redis.call('HSET', KEYS[1], 'cursor', p + 1)
    redis.call('HINCRBY', KEYS[1], 'steals', 1)
    redis.call('HINCRBY', KEYS[13], 'steals', 1)
  end
end
if not pick then
  local done = tonumber(redis.call('HGET', KEYS[1], 'done') or '0')
  return answer({S.OK, A.NOTHING, done, redis.call('HLEN', KEYS[3]), consumed})
end
redis.call('SETBIT', KEYS[2], pick, 1)
local token = redis.call('INCR', KEYS[6])
local expires = now + tonumber(ARGV[2])
redis.call('HSET', KEYS[3], pick, token .. ' ' .. expires .. ' ' .. ARGV[8] .. ' ' .. id)
redis.call('ZADD', KEYS[4], expires, pick)
local offset = tonumber(redis.call('HGET', KEYS[10], pick) or '0')
return answer({S.OK, pick, token, expires, offset, consumed})
