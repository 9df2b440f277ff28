--[[ hold: keep a published message in its group until a dispatcher picks it.
KEYS[1]  fair queue prefix
ARGV[1]  hold id (the task id); made unique with a suffix if already held, unless what is
         held under it is this very value: the same publication reaching Redis twice
         (redis-py resends a call whose reply a dropped connection lost), held once
ARGV[2]  stored value (envelope.py layout: class, front, cost, group, message)
ARGV[3]  due time in ms (0: now)
ARGV[4]  now in ms
Returns: the hold id used.
Error (before anything is written): a value that does not decode (envelope.py layout,
cost in range), a due time that is not a number, a key of a foreign type.
Wakes dispatchers when the group became ready or the message is the next one due. ]]
-- @include common
local id, value = ARGV[1], ARGV[2]
local due, now = finite(ARGV[3]), finite(ARGV[4])
local m = decode(value)
if not m or not due or not now then
  return redis.error_reply('ERR hold ' .. id .. ': the stored value does not decode or ' ..
                           'a time is not a finite number')
end
local cls, front, g = m.cls, m.front, m.g

-- A script stopped by an error keeps the writes it made. So every key this hold writes
-- is read first: one of a foreign type fails the hold here, before its first write, and
-- a hold is all or nothing (never a held count without its message).
local function preflight()
  redis.call('HGET', K_STAT, 'dup')
  redis.call('SISMEMBER', K_GROUPS, g)
  redis.call('HGET', k_group(g), 'n')
  if due > now then
    redis.call('ZSCORE', K_DELAYED, id)
    return
  end
  redis.call('ZSCORE', K_BACKLOG, g)
  for _, c in ipairs(CLASSES) do
    redis.call('LLEN', k_list(c, g))
    redis.call('ZSCORE', k_ready(c), g)
    redis.call('HGET', K_VT, c)
  end
  redis.call('HGET', K_CAPS, g)
  redis.call('HGET', K_CONF, 'cap')
  redis.call('LLEN', K_WAKE)
end

local held = redis.call('HGET', K_MSG, id)
if held == value then return id end
preflight()
if held then
  id = id .. '~' .. redis.call('HINCRBY', K_STAT, 'dup', 1)
  index_copy(id)  -- so cancel finds it
end
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
