-- barrier: what the barrier scripts share, bounded at any job size. A script that names
-- this file on a "-- uses: lib/..." line gets it joined onto its prelude line (comments
-- dropped), so its line numbers stay.
-- live_arrived and absent_ids need the keys of arrive_barrier and check_barrier: KEYS[1] = barrier state HASH (its 'ev': the last
-- membership event id when the generation opened), KEYS[2] = arrived SET,
-- KEYS[6] = heartbeats ZSET (the live workers), KEYS[8] = membership events STREAM.
-- live_arrived(n): how many of the n arrived workers are still live. An arrived worker
--   stops being live only by leaving or being declared failed, each an event after 'ev',
--   so this reads those events: O(events since the opening), not O(workers). Past
--   LIVE_EVENTS of them, or when the opening event was trimmed from the stream, it counts
--   by a scan of the live workers instead (O(workers): heavy churn in one generation).
-- absent_ids(limit): up to `limit` live workers that have not arrived, looking at no more
--   than ABSENT_SCAN live workers (a broken barrier's record names a few; its count of
--   absent workers is exact, from live_arrived).
-- push_tokens(state, list, gen, token, n, ttl_ms): the tokens that release n list waiters
--   of generation gen (RPUSH to list, then PEXPIRE ttl_ms): at most TOKENS_NOW now; the rest
--   are owed (field 'owed:<gen>' of the state HASH: "<count>\n<token>") and the first token
--   of the batch is marked "+": the waiter that pops it runs refill_release, which pushes
--   the next batch the same way (so 10^5 waiters cost ~25 short calls, not one long one).
local unpack = unpack or table.unpack
local LIVE_EVENTS, ABSENT_SCAN, TOKENS_NOW = 1000, 4000, 4096
local function live_arrived(n)
  local ev = redis.call('HGET', KEYS[1], 'ev') or '0-0'
  local after = redis.call('XRANGE', KEYS[8], '(' .. ev, '+', 'COUNT', LIVE_EVENTS + 1)
  if #after <= LIVE_EVENTS and ev ~= '0-0' and #redis.call('XRANGE', KEYS[8], ev, ev) == 1 then
    local gone, seen = 0, {}
    for _, e in ipairs(after) do
      local f, kind, w = e[2], nil, nil
      for i = 1, #f, 2 do
        if f[i] == 'type' then kind = f[i + 1] elseif f[i] == 'worker' then w = f[i + 1] end
      end
      if w and not seen[w] and (kind == 'leave' or kind == 'fail') then
        seen[w] = true
        if redis.call('SISMEMBER', KEYS[2], w) == 1 and not redis.call('ZSCORE', KEYS[6], w) then
          gone = gone + 1
        end
      end
    end
    return n - gone
  end
  local live = 0
  for _, w in ipairs(redis.call('ZRANGE', KEYS[6], 0, -1)) do
    live = live + redis.call('SISMEMBER', KEYS[2], w)
  end
  return live
end
local function absent_ids(limit)
  local out, total, start = {}, redis.call('ZCARD', KEYS[6]), 0
  while #out < limit and start < math.min(total, ABSENT_SCAN) do
    for _, w in ipairs(redis.call('ZRANGE', KEYS[6], start, start + 999)) do
      if #out < limit and redis.call('SISMEMBER', KEYS[2], w) == 0 then out[#out + 1] = w end
    end
    start = start + 1000
  end
  return out
end
local function push_tokens(state, list, gen, token, n, ttl_ms)
  local now = math.min(n, TOKENS_NOW)
  local owed = n - now
  local batch = {}
  for i = 1, math.min(now, 1000) do batch[i] = token end
  if owed > 0 then
    batch[1] = '+' .. token
    redis.call('HSET', state, 'owed:' .. gen, owed .. '\n' .. token)
  else
    redis.call('HDEL', state, 'owed:' .. gen)
  end
  local left = now
  while left > 0 do
    local k = math.min(left, #batch)
    redis.call('RPUSH', list, unpack(batch, 1, k))
    batch[1] = token
    left = left - k
  end
  redis.call('PEXPIRE', list, ttl_ms)
end
