-- barrier_live: who of a barrier's open generation is still live, without scanning every
-- worker of the job. A barrier script that names this file on a "-- uses: lib/..." line
-- gets it joined onto its prelude line (comments dropped), so its line numbers stay.
-- Needs the barrier scripts' keys: KEYS[1] = barrier state HASH (its 'ev': the last
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
local LIVE_EVENTS, ABSENT_SCAN = 1000, 4000
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
