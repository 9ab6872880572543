-- join_rendezvous: a worker joins the elastic rendezvous; the round it gets is the same
-- (round, rank, world size) for every member. A round opens at the first join (or when a
-- member of the closed round asks for a new one after it broke), collects joiners, and
-- closes when max_workers joined, or when min_workers joined and the last-call window
-- (Redis' clock) passed, or at once when every live member of the previous round and every
-- live waiting worker is in (a re-rendezvous after a failure need not wait out the window).
-- Closing gives dense ranks 0..N-1: the previous round's members keep their order, new ones
-- follow in arrival order. A worker arriving while a round runs waits for the next one,
-- unless a member of the running round is dead: then the round is broken and it opens the
-- next one. Only live workers (live heartbeat, current incarnation) count.
-- KEYS[1] = rendezvous HASH    KEYS[2] = waiting ZSET      KEYS[3] = rendezvous events STREAM
-- KEYS[4] = heartbeats ZSET    KEYS[5] = status HASH       KEYS[6] = incarnation HASH
-- KEYS[7] = generation STRING
-- KEYS[8] = members ZSET of round g      KEYS[9] = ranks HASH of round g
-- KEYS[10] = members ZSET of round g+1   KEYS[11] = ranks HASH of round g+1
-- KEYS[12] = ranks HASH of round g-1
-- ARGV[1] = worker id   ARGV[2] = its incarnation   ARGV[3] = g: the round the caller
-- believes current   ARGV[4] = the round the caller was a member of and leaves (it broke),
-- or 0   ARGV[5] = min_workers   ARGV[6] = max_workers   ARGV[7] = last-call window, ms
-- ARGV[8] = events stream cap   ARGV[9] = how long a finished round's keys are kept, ms
-- returns {S.OK, 'closed', round, rank, world_size, fresh, failure restarts, growth
--          restarts (rounds ended by leaves count in neither), membership generation at close, last event id, member...}
--          fresh = 1: no member was in the previous round (a whole-job (re)start)
--       | {S.OK, 'joining', round, joined, deadline_ms (0: not set), now_ms, last event id}
--       | {S.OK, 'waiting', round, now_ms, last event id}: a round runs; wait for the next
--       | {S.ROUND_MOVED, round}: g is stale, call again with this round
--       | {S.WORKER_NOT_REGISTERED} | {S.WORKER_FAILED} | {S.WORKER_LEFT} | {S.WORKER_REPLACED}
local id, inc = ARGV[1], ARGV[2]
local g, leaving = tonumber(ARGV[3]), tonumber(ARGV[4])
local min_w, max_w, last_call = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local cap, keep_ms = ARGV[8], tonumber(ARGV[9])
local R = KEYS[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local status = redis.call('HGET', KEYS[5], id)
if not status then return {S.WORKER_NOT_REGISTERED} end
if status == 'failed' then return {S.WORKER_FAILED} end
if status == 'left' then return {S.WORKER_LEFT} end
if redis.call('HGET', KEYS[6], id) ~= inc then return {S.WORKER_REPLACED} end

local cur = tonumber(redis.call('HGET', R, 'round') or '0')
if cur ~= g then return {S.ROUND_MOVED, cur} end

local function last_event()
  local last = redis.call('XREVRANGE', KEYS[3], '+', '-', 'COUNT', 1)
  if #last > 0 then return last[1][1] end
  return '0-0'
end

local function alive(member, member_inc)
  return redis.call('ZSCORE', KEYS[4], member) and redis.call('HGET', KEYS[6], member) == member_inc
end

local function inc_of(rank_value)
  return string.match(rank_value, ' (%d+)$')
end

-- the first member of a closed round that is no longer alive: its id and why
local function casualty(ranks_key)
  local ranks = redis.call('HGETALL', ranks_key)
  for i = 1, #ranks, 2 do
    if not alive(ranks[i], inc_of(ranks[i + 1])) then
      local st = redis.call('HGET', KEYS[5], ranks[i])
      if st ~= 'failed' and st ~= 'left' then st = 'replaced' end
      return ranks[i], st
    end
  end
  return nil, nil
end

local function open(n, reason)
  redis.call('HSET', R, 'round', n, 'state', 'joining', 'opened_ms', now, 'deadline_ms', 0,
    'world_size', 0)
  if n > 1 then redis.call('HINCRBY', R, 'restarts_' .. reason, 1) end
  redis.call('XADD', KEYS[3], 'MAXLEN', '~', cap, '*', 'type', 'open', 'round', n,
    'reason', reason, 'ms', now)
end

local function assignment(n, members_key, ranks_key)
  local rank = tonumber(string.match(redis.call('HGET', ranks_key, id), '^(%d+) '))
  local f = redis.call('HMGET', R, 'world_size', 'fresh', 'restarts_failure', 'restarts_growth',
    'generation')
  local out = {S.OK, 'closed', n, rank, tonumber(f[1]), tonumber(f[2]), tonumber(f[3] or '0'),
    tonumber(f[4] or '0'), tonumber(f[5] or '0'), last_event()}
  for _, m in ipairs(redis.call('ZRANGE', members_key, 0, -1)) do out[#out + 1] = m end
  return out
end

local function close(n, members_key, ranks_key, prev_key)
  local members = redis.call('ZRANGE', members_key, 0, -1)
  local fresh = 1
  for i, m in ipairs(members) do
    local m_inc = redis.call('HGET', KEYS[6], m)
    redis.call('HSET', ranks_key, m, (i - 1) .. ' ' .. m_inc)
    local before = redis.call('HGET', prev_key, m)
    if before and inc_of(before) == m_inc then fresh = 0 end
    redis.call('ZREM', KEYS[2], m)
  end
  redis.call('HSET', R, 'state', 'closed', 'world_size', #members, 'closed_ms', now,
    'fresh', fresh, 'generation', redis.call('GET', KEYS[7]) or '0')
  redis.call('XADD', KEYS[3], 'MAXLEN', '~', cap, '*', 'type', 'close', 'round', n,
    'world_size', #members, 'ms', now)
  redis.call('PEXPIRE', prev_key, keep_ms)
  return assignment(n, members_key, ranks_key)
end

local function join(n, members_key, ranks_key, prev_key)
  for _, m in ipairs(redis.call('ZRANGE', members_key, 0, -1)) do
    if not redis.call('ZSCORE', KEYS[4], m) then redis.call('ZREM', members_key, m) end
  end
  if not redis.call('ZSCORE', members_key, id) then
    if redis.call('ZCARD', members_key) >= max_w then
      redis.call('ZADD', KEYS[2], now, id)
      return {S.OK, 'waiting', n, now, last_event()}
    end
    local before = redis.call('HGET', prev_key, id)
    local score = 1e13 + now
    if before and inc_of(before) == inc then score = tonumber(string.match(before, '^(%d+) ')) end
    redis.call('ZADD', members_key, score, id)
    redis.call('ZREM', KEYS[2], id)
  end
  local count = redis.call('ZCARD', members_key)
  -- who else is expected: the previous round's live members and the live waiting workers
  local pending, returning = 0, 0
  local prev = redis.call('HGETALL', prev_key)
  for i = 1, #prev, 2 do
    if alive(prev[i], inc_of(prev[i + 1])) then
      if redis.call('ZSCORE', members_key, prev[i]) then returning = returning + 1
      else pending = pending + 1 end
    end
  end
  for _, w in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
    if not redis.call('ZSCORE', KEYS[4], w) then redis.call('ZREM', KEYS[2], w)
    elseif not redis.call('ZSCORE', members_key, w) then pending = pending + 1 end
  end
  local deadline = tonumber(redis.call('HGET', R, 'deadline_ms') or '0')
  if count >= min_w and deadline == 0 then
    deadline = now + last_call
    redis.call('HSET', R, 'deadline_ms', deadline)
  end
  if count >= max_w or (count >= min_w and (now >= deadline or (returning > 0 and pending == 0))) then
    return close(n, members_key, ranks_key, prev_key)
  end
  return {S.OK, 'joining', n, count, deadline, now, last_event()}
end

if cur == 0 then
  open(1, 'start')
  return join(1, KEYS[10], KEYS[11], KEYS[9])
end
if redis.call('HGET', R, 'state') == 'joining' then return join(g, KEYS[8], KEYS[9], KEYS[12]) end
-- round g is closed (running)
local mine = redis.call('HGET', KEYS[9], id)
local member = mine and inc_of(mine) == inc
if member and leaving ~= g then return assignment(g, KEYS[8], KEYS[9]) end
if not member then
  local culprit, why = casualty(KEYS[9])
  if not culprit then
    redis.call('ZADD', KEYS[2], now, id)
    return {S.OK, 'waiting', g, now, last_event()}
  end
  redis.call('HSET', R, 'broken_round', g, 'broken', culprit, 'reason', why)
end
-- a round ended by members leaving (a finished job, a relaunch) is not a failure restart
local kind = 'failure'
local fate = redis.call('HMGET', R, 'broken_round', 'reason')
if tonumber(fate[1]) == g and fate[2] == 'left' then kind = 'leave' end
redis.call('PEXPIRE', KEYS[8], keep_ms)
open(g + 1, kind)
return join(g + 1, KEYS[10], KEYS[11], KEYS[9])
