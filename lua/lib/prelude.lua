-- prelude: what every script shares, joined onto its first line when scripts.py loads it
-- (after the era and clock check of status.ERA_CHECK, before the lib/ pieces the script
-- names; comments dropped, so no comment may follow code on a line here, and the script's
-- line numbers stay its file's). A script names none of this on a "-- uses:" line.
-- KEYS, ARGV: none of its own (it reads neither); returns nothing (it only defines).
-- NOW_MS(): Redis' clock (TIME) in whole milliseconds: the one clock every process of a job
--   shares (leases, heartbeats, deadlines and records are stamped with it, never with a
--   caller's). Each call asks TIME afresh: a script that needs one instant calls it once.
-- NOW_US(): the clock in microseconds, as a string of digits (exact, and what a barrier's
--   latency record stores); it asks TIME afresh too, so it is not NOW_MS()'s instant.
local function NOW_MS()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function NOW_US()
  local t = redis.call('TIME')
  return t[1] .. string.format('%06d', tonumber(t[2]))
end
