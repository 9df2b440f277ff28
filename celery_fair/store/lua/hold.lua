--[[ hold: keep a published message in its group until a dispatcher picks it.
KEYS[1]  fair queue prefix
ARGV[1]  hold id (the task id); made unique with a suffix if already held, unless what is
         held under it is this very value: the same publication reaching Redis twice
         (redis-py resends a call whose reply a dropped connection lost), held once
ARGV[2]  stored value (envelope.py layout: class, front, cost, group, message)
ARGV[3]  due time in ms (0: now)
ARGV[4]  now in ms
Returns: the hold id used.
Wakes dispatchers when the group became ready or the message is the next one due. ]]
-- @include common
local id, value = ARGV[1], ARGV[2]
local due, now = tonumber(ARGV[3]), tonumber(ARGV[4])
local held = redis.call('HGET', K_MSG, id)
if held == value then return id end
if held then
  id = id .. '~' .. redis.call('HINCRBY', K_STAT, 'dup', 1)
  index_copy(id)  -- so cancel finds it
end
local cls, front, _, g = parse(value)
-- The message's list or delayed entry is written first: should a key of a foreign type
-- make a write fail (the script stops there, without rollback), nothing is half-held.
if due > now then
  redis.call('ZADD', K_DELAYED, due, id)
  redis.call('HSET', K_MSG, id, value)
  redis.call('SADD', K_GROUPS, g)
  redis.call('HINCRBY', k_group(g), 'd', 1)
  if redis.call('ZRANGE', K_DELAYED, 0, 0)[1] == id then wake() end
  return id
end
if front then
  redis.call('LPUSH', k_list(cls, g), id)
else
  redis.call('RPUSH', k_list(cls, g), id)
end
redis.call('HSET', K_MSG, id, value)
redis.call('SADD', K_GROUPS, g)
count_held(cls, g, 1)
if refresh(g) then wake() end
return id
