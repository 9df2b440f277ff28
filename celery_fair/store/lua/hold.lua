--[[ hold: keep a published message in its group until a dispatcher picks it.
KEYS[1]  fair queue prefix
ARGV[1]  hold id (the task id); made unique with a suffix if already held, unless what is
         held under it is this very value: the same publication reaching Redis twice
         (redis-py resends a call whose reply a dropped connection lost), held once
ARGV[2]  stored value (envelope.py layout: class, front, cost, group, message)
ARGV[3]  due time in ms (0: now)
ARGV[4]  now in ms
ARGV[5]  group  } the placement, given by the caller (Store.hold takes it as arguments;
ARGV[6]  class  } RedisStore checked it with check_hold): this script places the message
ARGV[7]  cost   } by these, and never derives them from the value
ARGV[8]  front ('1': at the head of its group, a retry; '0': at its tail)
ARGV[9]  max held ('': unlimited): backpressure (fair_group_max_held); refuse the hold
         when the group already holds this many messages (both classes' lists and its
         delayed ones). A resend of what is held under ARGV[1] is never refused.
A message that becomes its list's head (to the front, or into an empty list) stamps the
group's head time of its class (`h<class>` in `g:<group>`: ARGV[4]).
Returns: the hold id used.
Errors (before anything is written): FULL <count> <limit> <group> when the
group is full; CORRUPT when the value's prefix is not envelope.py's
encoding of this placement; ERR for a placement out of range, a due time that is not a
number, a key of a foreign type.
Why the prefix is checked against the arguments: pick, promote, cancel and check read
the placement back from the stored prefix later; a value whose prefix disagreed would be
counted in one group here and in another there (in-flight counts and tags silently
wrong). The check is cheap: the prefix is a few bytes of string ops, no JSON.
Wakes dispatchers when the group became ready or the message is the next one due. ]]
-- @include common
local id, value = ARGV[1], ARGV[2]
local due, now = finite(ARGV[3]), finite(ARGV[4])
local g, cls, cost, front = ARGV[5], ARGV[6], tonumber(ARGV[7]), ARGV[8] == '1'
if not due or not now or (cls ~= 'i' and cls ~= 'b') or #g == 0 or not cost
   or not (cost > 0 and cost <= MAX_COST) then
  return redis.error_reply('ERR hold ' .. id .. ': a time is not a finite number or the ' ..
                           'placement is out of range (class i or b, a group, a cost in ' ..
                           '(0, ' .. MAX_COST .. '])')
end
local m = decode(value)
if not m or m.g ~= g or m.cls ~= cls or m.cost ~= cost or m.front ~= front then
  return redis.error_reply('CORRUPT hold ' .. id .. ': the stored value\'s prefix is not ' ..
                           'envelope.py\'s encoding of the placement given (class, front, ' ..
                           'cost, group)')
end

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
local max_held = tonumber(ARGV[9])
if max_held then
  local n = redis.call('LLEN', k_list('i', g)) + redis.call('LLEN', k_list('b', g))
            + tonumber(redis.call('HGET', k_group(g), 'd') or '0')
  if n >= max_held then return redis.error_reply('FULL ' .. n .. ' ' .. ARGV[9] .. ' ' .. g) end
end
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
local len
if front then
  len = redis.call('LPUSH', k_list(cls, g), id)
else
  len = redis.call('RPUSH', k_list(cls, g), id)
end
-- a new head (to the front, or into an empty list): its head time is now
if front or len == 1 then redis.call('HSET', k_group(g), 'h' .. cls, ARGV[4]) end
redis.call('HSET', K_MSG, id, value)
redis.call('SADD', K_GROUPS, g)
count_held(cls, g, 1)
if refresh(g) then wake() end
return id
