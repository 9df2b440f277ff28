--[[ pick: take up to ARGV[2] held messages in fair order and mark each dispatch 'picked'.
Interactive groups come first; within a class the group with the lowest virtual start
tag wins (ZSET head: O(log G)), and its tag advances by cost / weight.
KEYS[1]  fair queue prefix
ARGV[1]  now in ms
ARGV[2]  most messages to take
ARGV[3]  capacity of the fair queue (-1: none); counts every in-flight dispatch
ARGV[4]  lease of a picked dispatch in ms (how long the dispatcher may take to publish)
ARGV[5]  dispatch id prefix (unique per call)
Returns: flat array {dispatch id, hold id, stored value, ...}. ]]
-- @include common
local now, want, capacity = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local deadline, token = now + tonumber(ARGV[4]), ARGV[5]
if capacity >= 0 then
  local room = capacity - tonumber(redis.call('HGET', K_STAT, 'inflight') or '0')
  if room < want then want = room end
end
local default_weight = tonumber(redis.call('HGET', K_CONF, 'weight') or '1')

local function head()
  for _, cls in ipairs(CLASSES) do
    local top = redis.call('ZRANGE', k_ready(cls), 0, 0, 'WITHSCORES')
    if top[1] then return cls, top[1], tonumber(top[2]) end
  end
end

local out, taken = {}, 0
while taken < want do
  local cls, g, tag = head()
  if not cls then break end
  local id = redis.call('LPOP', k_list(cls, g))
  local value = id and redis.call('HGET', K_MSG, id)
  if value then
    redis.call('HDEL', K_MSG, id)
    local _, _, cost = parse(value)
    local weight = tonumber(redis.call('HGET', K_WEIGHTS, g) or default_weight)
    local gk = k_group(g)
    redis.call('HSET', K_VT, cls, tag)
    redis.call('HSET', gk, 't' .. cls, tag + cost / weight)
    redis.call('HINCRBY', gk, 'n', 1)
    taken = taken + 1
    local did = token .. taken
    redis.call('HSET', k_dispatch(did), 's', 'picked', 'g', g, 'c', cls, 'id', id, 'v', value)
    redis.call('ZADD', K_LEASES, deadline, did)
    out[#out + 1] = did
    out[#out + 1] = id
    out[#out + 1] = value
  end
  -- the tag moved and the cap may be reached: re-rank or drop the group
  redis.call('ZREM', k_ready(cls), g)
  refresh(g)
end
if taken > 0 then redis.call('HINCRBY', K_STAT, 'inflight', taken) end
return out
