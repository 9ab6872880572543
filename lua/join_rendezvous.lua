-- join_rendezvous: a worker joins the elastic rendezvous; the round it gets is the same
-- (round, rank, world size) for every member. A round opens at the first join (or when a
-- member of the closed round asks for a new one after it broke), collects joiners, and
-- closes when max_workers joined, or when min_workers joined and the last-call window
-- (Redis' clock) passed, or at once when every live member of the previous round and every
-- live waiting worker is in (a re-rendezvous after a failure need not wait out the window).
-- Ranks are dense, 0..N-1: a member's rank is its place in the round's members ZSET, where
-- the previous round's members that carry the job's state keep their order, then the others
-- of it, then new ones in arrival order (carrying: lib/rendezvous.lua). A
-- worker arriving while a round runs waits for the next one, unless a member of the running
-- round is dead: then the round is broken and it opens the next one. Only live workers (live
-- heartbeat, current incarnation) count. A worker that waits while the running round is at
-- max_workers is a spare (the caller may wait for it without a deadline). Once the rendezvous
-- is ended for good (its 'ended' field, set by end()), nobody joins any more.
-- Bounded at any size (uses: lib/rendezvous.lua): a call reads at most 500 membership events
-- and scans at most 256 entries (members that died leave the round; the set of workers the
-- round still waits for is filled in steps after it opens), and closing is O(1): a closed
-- round's reply carries no member list, members read its members ZSET by pages.
-- uses: lib/rendezvous.lua
-- KEYS[1] = rendezvous HASH    KEYS[2] = waiting ZSET      KEYS[3] = rendezvous events STREAM
-- KEYS[4] = heartbeats ZSET    KEYS[5] = status HASH       KEYS[6] = incarnation HASH
-- KEYS[7] = generation STRING  KEYS[8] = membership events STREAM
-- KEYS[9] = members ZSET of round g-1      KEYS[10] = ranks HASH of round g-1
-- KEYS[11] = members ZSET of round g       KEYS[12] = ranks HASH of round g
-- KEYS[13] = expected SET of round g
-- KEYS[14] = members ZSET of round g+1     KEYS[15] = ranks HASH of round g+1
-- KEYS[16] = expected SET of round g+1
-- ARGV[1] = worker id   ARGV[2] = its incarnation   ARGV[3] = g: the round the caller
-- believes current   ARGV[4] = the round the caller was a member of and leaves (it broke),
-- or 0   ARGV[5] = min_workers   ARGV[6] = max_workers   ARGV[7] = last-call window, ms
-- ARGV[8] = events stream cap   ARGV[9] = how long a finished round's keys are kept, ms
-- returns {S.OK, 'closed', round, rank, world_size, fresh, failure restarts, growth
--          restarts (rounds ended by leaves count in neither), membership generation at
--          close, last event id}: fresh = 1: no member carries the job's state from the
--          previous round (a whole-job (re)start: every member resumes from the newest
--          checkpoint; the round is then synced); the members are the round's members ZSET,
--          in rank order
--       | {S.OK, 'joining', round, joined, deadline_ms (0: not set), now_ms, last event id}
--       | {S.OK, 'waiting', round, now_ms, spare, last event id}: a round runs; wait for the
--          next; spare = 1: the round it waits behind is at max_workers (it cannot be admitted
--          unless a member goes)
--       | {S.ROUND_MOVED, round}: g is stale, call again with this round
--       | {S.RENDEZVOUS_ENDED}: the rendezvous was ended for good
--       | {S.WORKER_NOT_REGISTERED} | {S.WORKER_FAILED} | {S.WORKER_LEFT} | {S.WORKER_REPLACED}
local id, inc = ARGV[1], ARGV[2]
local g, leaving = tonumber(ARGV[3]), tonumber(ARGV[4])
local min_w, max_w, last_call = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local cap, keep_ms = ARGV[8], tonumber(ARGV[9])
local R = KEYS[1]
local now = NOW_MS()

if redis.call('HGET', R, 'ended') == '1' then return {S.RENDEZVOUS_ENDED} end

local status = redis.call('HGET', KEYS[5], id)
if not status then return {S.WORKER_NOT_REGISTERED} end
if status == 'failed' then return {S.WORKER_FAILED} end
if status == 'left' then return {S.WORKER_LEFT} end
if redis.call('HGET', KEYS[6], id) ~= inc then return {S.WORKER_REPLACED} end

local round = redis.call('HGET', R, 'round')
-- the caller saw round g: a rendezvous with no round now lost its hash (G.ANCHORS)
if G.ANCHORS and g > 0 and not round then return LOST(R) end
local cur = tonumber(round or '0')
if cur ~= g then return {S.ROUND_MOVED, cur} end

-- the keys of round g (this = 0) or g+1 (this = 1), as the shared functions take them
local function round_keys(this)
  return {R = R, waiting = KEYS[2], rv_events = KEYS[3], hb = KEYS[4], status = KEYS[5],
    incs = KEYS[6], gen = KEYS[7], events = KEYS[8],
    prev_members = KEYS[9 + 2 * this], prev_ranks = KEYS[10 + 2 * this],
    members = KEYS[11 + 3 * this], ranks = KEYS[12 + 3 * this], expected = KEYS[13 + 3 * this]}
end

local function assignment(n, k)
  local f = redis.call('HMGET', R, 'world_size', 'fresh', 'restarts_failure', 'restarts_growth',
    'generation')
  return {S.OK, 'closed', n, redis.call('ZRANK', k.members, id), tonumber(f[1]), tonumber(f[2]),
    tonumber(f[3] or '0'), tonumber(f[4] or '0'), tonumber(f[5] or '0'), last_id(k.rv_events)}
end

local function close(n, k)
  local world = redis.call('ZCARD', k.members)
  local fresh = 1
  if carrying(k) > 0 then fresh = 0 end
  redis.call('HSET', R, 'state', 'closed', 'world_size', world, 'closed_ms', now,
    'fresh', fresh, 'generation', redis.call('GET', k.gen) or '0')
  if fresh == 1 then redis.call('HSET', R, 'synced', n) end
  redis.call('XADD', k.rv_events, 'MAXLEN', '~', cap, '*', 'type', 'close', 'round', n,
    'world_size', world, 'ms', now)
  redis.call('PEXPIRE', k.prev_members, keep_ms)
  redis.call('PEXPIRE', k.prev_ranks, keep_ms)
  redis.call('UNLINK', k.expected)
  return assignment(n, k)
end

local function join(n, k)
  local _, behind = members_gone(k, true)
  local ready = expect_step(k)
  local had = redis.call('HGET', k.ranks, id)
  if had and inc_of(had) ~= inc then
    drop(k, id)
    had = nil
  end
  if not had then
    if redis.call('ZCARD', k.members) >= max_w then
      redis.call('ZADD', k.waiting, now, id)
      return {S.OK, 'waiting', n, now, 1, last_id(k.rv_events)}
    end
    local score = NEW + now
    if inc_of(redis.call('HGET', k.prev_ranks, id)) == inc then
      local before = redis.call('ZSCORE', k.prev_members, id)
      if before then
        score = redis.call('ZRANK', k.prev_members, id)
        -- (it carries the state on if it carried it in, or the round was synced since)
        if tonumber(before) >= CARRIED and redis.call('HGET', R, 'synced') ~= tostring(n - 1) then
          score = CARRIED + score
        end
      end
    end
    redis.call('ZADD', k.members, score, id)
    redis.call('HSET', k.ranks, id, inc)
    redis.call('ZREM', k.waiting, id)
    redis.call('SREM', k.expected, id)
  end
  local count = redis.call('ZCARD', k.members)
  local deadline = tonumber(redis.call('HGET', R, 'deadline_ms') or '0')
  if count >= min_w and deadline == 0 then
    deadline = now + last_call
    redis.call('HSET', R, 'deadline_ms', deadline)
  end
  -- everyone expected is in: the previous round's live members (some returned) and the
  -- live waiting workers (known once the opening's scan is done)
  local all_back = ready and returning(k) > 0
    and redis.call('SCARD', k.expected) == 0
  -- (never while membership events are unread: a member that died must not be closed in)
  if not behind and (count >= max_w or (count >= min_w and (now >= deadline or all_back))) then
    return close(n, k)
  end
  return {S.OK, 'joining', n, count, deadline, now, last_id(k.rv_events)}
end

if cur == 0 then
  open_round(round_keys(1), 1, 'start', now, cap)
  return join(1, round_keys(1))
end
local this = round_keys(0)
if redis.call('HGET', R, 'state') == 'joining' then return join(g, this) end
-- round g is closed (running)
local member = inc_of(redis.call('HGET', this.ranks, id)) == inc
if member and leaving ~= g then return assignment(g, this) end
if not member and redis.call('HGET', R, 'broken_round') ~= tostring(g) then
  local culprit = members_gone(this, false)
  if not culprit then
    redis.call('ZADD', KEYS[2], now, id)
    local spare = 0
    if tonumber(redis.call('HGET', R, 'world_size') or '0') >= max_w then spare = 1 end
    return {S.OK, 'waiting', g, now, spare, last_id(KEYS[3])}
  end
  redis.call('HSET', R, 'broken_round', g, 'broken', culprit, 'reason', why_gone(this, culprit))
end
-- a round ended by members leaving (a finished job, a relaunch) is not a failure restart
local kind = 'failure'
local fate = redis.call('HMGET', R, 'broken_round', 'reason')
if tonumber(fate[1]) == g and fate[2] == 'left' then kind = 'leave' end
redis.call('PEXPIRE', this.members, keep_ms)
redis.call('PEXPIRE', this.ranks, keep_ms)
open_round(round_keys(1), g + 1, kind, now, cap)
return join(g + 1, round_keys(1))
