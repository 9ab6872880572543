-- rendezvous: what the rendezvous scripts share, bounded at any round size (10^5 members).
-- A script that names this file on a "-- uses: lib/..." line gets it joined onto its prelude
-- line (comments dropped: no comment may follow code on a line here), so its line numbers stay.
-- Every function takes the keys it needs in a table k:
--   k.R = rendezvous HASH, k.hb = heartbeats ZSET, k.incs = incarnation HASH,
--   k.status = status HASH, k.events = membership events STREAM, k.gen = generation STRING,
--   k.rv_events = rendezvous events STREAM, k.waiting = waiting ZSET,
--   k.members / k.ranks = the round's members ZSET (order) / HASH (member -> incarnation),
--   k.prev_members / k.prev_ranks = the previous round's, k.expected = the round's SET of
--   live workers it still waits for (the previous round's live members, the live waiting).
-- The round in R keeps a cursor over the membership events: 'mev' (the last event read) and
-- 'mgen' (its generation; every membership event carries the generation it made, so a gap
-- means events were trimmed from the stream before they were read). members_gone reads at
-- most EVENT_STEP events per call; after a gap it also scans the round's members in HSCAN
-- steps ('mscan': the HSCAN cursor, '' when no scan runs), so a death is never missed.
-- While the round is joining, a member found dead leaves it; once closed, it is the casualty.
-- returning(k): how many members were in the previous round (their order scores are below
-- NEW; a new member's is NEW + its arrival ms): O(log N). carrying(k): how many of them carry
-- the job's state (scores below CARRIED: their previous ranks; a previous member that does
-- not carry it scores CARRIED + its previous rank). A member of round n-1 carries the state
-- into round n when it carried it into n-1, or when round n-1 was synced (R's 'synced' =
-- n-1: it was fresh, every member restoring the checkpoint, or it passed an epoch barrier
-- whole: review_round). A worker that joined a running job and lost every carrier before
-- either never got the state: a round with no carrier is fresh (it resumes from the newest
-- checkpoint), never a continuation of a model nobody holds.
-- expect_step: one step of filling k.expected at a round's opening ('escan': P:<cursor> over
-- the previous round's members, then W:<cursor> over the waiting workers, then 'done'), of
-- EXPECT_STEP entries (a previous round of 10^5 takes ~400 joins).
-- A ranks value is the member's incarnation ("<rank> <incarnation>" from before 0.x reads the
-- same: inc_of takes the last number).
-- open_round: round n opens (all the per-round fields reset).
local EVENT_STEP, SCAN_STEP, EXPECT_STEP = 500, 256, 256
local function inc_of(value)
  if value then return string.match(value, '(%d+)$') end
  return nil
end
local function last_id(stream)
  local last = redis.call('XREVRANGE', stream, '+', '-', 'COUNT', 1)
  if #last > 0 then return last[1][1] end
  return '0-0'
end
local function is_alive(k, w, w_inc)
  return redis.call('ZSCORE', k.hb, w) ~= false and redis.call('HGET', k.incs, w) == inc_of(w_inc)
end
local function why_gone(k, w)
  local st = redis.call('HGET', k.status, w)
  if st ~= 'failed' and st ~= 'left' then st = 'replaced' end
  return st
end
local NEW, CARRIED = 10000000000000, 5000000000000
local function returning(k)
  return redis.call('ZCOUNT', k.members, '-inf', '(' .. NEW)
end
local function carrying(k)
  return redis.call('ZCOUNT', k.members, '-inf', '(' .. CARRIED)
end
local function drop(k, w)
  redis.call('ZREM', k.members, w)
  redis.call('HDEL', k.ranks, w)
end
local function visit(k, w, joining)
  if joining and k.expected and not redis.call('ZSCORE', k.hb, w) then
    redis.call('SREM', k.expected, w)
  end
  local w_inc = redis.call('HGET', k.ranks, w)
  if not w_inc or is_alive(k, w, w_inc) then return nil end
  if not joining then return w end
  drop(k, w)
  return nil
end
local function members_gone(k, joining)
  local f = redis.call('HMGET', k.R, 'mev', 'mgen', 'mscan')
  local cur, seen, scan = f[1] or '0-0', tonumber(f[2] or '0'), f[3] or ''
  local gone = nil
  for _, e in ipairs(redis.call('XRANGE', k.events, '(' .. cur, '+', 'COUNT', EVENT_STEP)) do
    local fl, w, eg = e[2], nil, nil
    for i = 1, #fl, 2 do
      if fl[i] == 'worker' then w = fl[i + 1] elseif fl[i] == 'generation' then eg = tonumber(fl[i + 1]) end
    end
    if eg then
      if eg > seen + 1 then scan = '0' end
      seen = eg
    end
    cur = e[1]
    if w and not gone then gone = visit(k, w, joining) end
  end
  if scan ~= '' and not gone then
    local r = redis.call('HSCAN', k.ranks, scan, 'COUNT', SCAN_STEP)
    scan = r[1]
    if scan == '0' then scan = '' end
    for i = 1, #r[2], 2 do
      if not gone then gone = visit(k, r[2][i], joining) end
    end
  end
  redis.call('HSET', k.R, 'mev', cur, 'mgen', seen, 'mscan', scan)
  local more = scan ~= '' or #redis.call('XRANGE', k.events, '(' .. cur, '+', 'COUNT', 1) > 0
  return gone, more
end
local function expect_step(k)
  local st = redis.call('HGET', k.R, 'escan') or 'done'
  if st == 'done' then return true end
  local phase, cursor = string.match(st, '^(%a):(%d+)$')
  if phase == 'P' then
    local r = redis.call('HSCAN', k.prev_ranks, cursor, 'COUNT', EXPECT_STEP)
    for i = 1, #r[2], 2 do
      local w = r[2][i]
      if is_alive(k, w, r[2][i + 1]) and not redis.call('ZSCORE', k.members, w) then
        redis.call('SADD', k.expected, w)
      end
    end
    if r[1] == '0' then st = 'W:0' else st = 'P:' .. r[1] end
  else
    local r = redis.call('ZSCAN', k.waiting, cursor, 'COUNT', EXPECT_STEP)
    for i = 1, #r[2], 2 do
      local w = r[2][i]
      if not redis.call('ZSCORE', k.hb, w) then redis.call('ZREM', k.waiting, w)
      elseif not redis.call('ZSCORE', k.members, w) then redis.call('SADD', k.expected, w) end
    end
    if r[1] == '0' then st = 'done' else st = 'W:' .. r[1] end
  end
  redis.call('HSET', k.R, 'escan', st)
  return st == 'done'
end
local function open_round(k, n, reason, now, cap)
  redis.call('HSET', k.R, 'round', n, 'state', 'joining', 'opened_ms', now, 'deadline_ms', 0,
    'world_size', 0, 'escan', 'P:0', 'mev', last_id(k.events),
    'mgen', redis.call('GET', k.gen) or '0', 'mscan', '')
  redis.call('DEL', k.expected)
  if n > 1 then redis.call('HINCRBY', k.R, 'restarts_' .. reason, 1) end
  redis.call('XADD', k.rv_events, 'MAXLEN', '~', cap, '*', 'type', 'open', 'round', n,
    'reason', reason, 'ms', now)
end
