-- register_dataset: store a dataset's parameters under its name, once.
-- Registering the same name with the same parameters again is a no-op; with different
-- parameters it is refused unless replace is asked for.
-- The HASH also keeps the field "" (no dataset's name: names are never empty) once anything
-- was registered, so it stands while the job's era does (an anchor: status.ANCHORS), even
-- when every dataset is deleted (strata_redis.data.datasets.delete_dataset).
-- KEYS[1] = datasets HASH
-- ARGV[1] = dataset name   ARGV[2] = canonical params JSON   ARGV[3] = "1" to replace, else "0"
-- returns {0, 1} created | {0, 0} already registered, same params | {0, 2} replaced
--       | {30} DATASET_CONFLICT: registered with other params
local old = redis.call('HGET', KEYS[1], ARGV[1])
if old == ARGV[2] then return {S.OK, 0} end
if old and ARGV[3] ~= '1' then return {S.DATASET_CONFLICT} end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2], '', 1)
if old then return {S.OK, 2} end
return {S.OK, 1}
