--[[ boost_task: move a held message to the front of its group's list, and its group to
the front of its class's ready set once (`fair boost --task`): the group's tag goes just
below the lower of the set's head and its own (decisions.py `front_tag`), so it is picked
next in its class. A group not in the ready set (capped,
paused) keeps that tag until it enters again. The class's virtual time is lowered to the
tag when above it (else a refresh of the group would take its tag back up to it).
Under Harmony the group's rank goes below both ready sets' heads instead (group field `j`,
spent by its next pick): first in the queue, once.
A message that was not the head already stamps the group's head time of its class
(`h<class>` in `g:<group>`: ARGV[2]).
KEYS[1]  fair queue prefix
ARGV[1]  hold id
ARGV[2]  now in ms
Returns: the group, or false when the message is not held (delayed, dispatched, unknown). ]]
-- @include common
local id = ARGV[1]
local value = redis.call('HGET', K_MSG, id)
local m = value and decode(value)
local was_head = m and redis.call('LINDEX', k_list(m.cls, m.g), 0) == id
if not m or unlist_held(m.cls, m.g, id) == 0 then return false end
redis.call('LPUSH', k_list(m.cls, m.g), id)
if not was_head then redis.call('HSET', k_group(m.g), 'h' .. m.cls, ARGV[2]) end
if harmony() then
  -- Harmony: the group's rank (`j`, both classes) goes just below the lower of both
  -- ready sets' heads and its own, until its next pick
  local lowest = harmony_rank(m.g, SC.count(m.g, inflight_of(m.g)))  -- the app's, as every rank
  for _, cls in ipairs(CLASSES) do
    local top = redis.call('ZRANGE', k_ready(cls), 0, 0, 'WITHSCORES')
    if top[2] and tonumber(top[2]) < lowest then lowest = tonumber(top[2]) end
  end
  redis.call('HSET', k_group(m.g), 'j',
             string.format('%.17g', lowest - 1e-9 * (1 + math.abs(lowest))))
  refresh(m.g)
  return m.g
end
local head = redis.call('ZRANGE', k_ready(m.cls), 0, 0, 'WITHSCORES')
local lowest = finite(redis.call('HGET', k_group(m.g), 't' .. m.cls) or '0') or 0
if head[2] and tonumber(head[2]) < lowest then lowest = tonumber(head[2]) end
-- decisions.py FRONT_EPSILON; written in full (%.17g), not Lua's 14 digits
local tag = string.format('%.17g', lowest - 1e-9 * (1 + math.abs(lowest)))
redis.call('HSET', k_group(m.g), 't' .. m.cls, tag)
-- the virtual time goes no higher than the tag, or a refresh would take the tag back to it
if tonumber(tag) < (finite(redis.call('HGET', K_VT, m.cls) or '0') or 0) then
  redis.call('HSET', K_VT, m.cls, tag)
end
redis.call('ZADD', k_ready(m.cls), 'XX', tag, m.g)
if soft_caps() then redis.call('ZADD', k_over(m.cls), 'XX', tag, m.g) end
return m.g
