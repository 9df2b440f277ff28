--[[ cancel: remove held or delayed messages by hold id (their task was revoked unrun).
A message already picked, queued or running is not touched: its task id is revoked in
the workers, and its slot comes back through the release receivers.
KEYS[1]  fair queue prefix
ARGV     hold ids: task ids, or <task id>~<n> for a copy held under a suffixed id
Returns: flat array {hold id, stored value, ...} of the messages removed. ]]
-- @include common
local out = {}
for _, id in ipairs(ARGV) do
  local value = redis.call('HGET', K_MSG, id)
  local m = value and decode(value)
  if value and not m then
    quarantine(id, value, 'cancel: undecodable stored value')
  elseif m then
    local cls, g = m.cls, m.g
    redis.call('HDEL', K_MSG, id)
    if redis.call('ZREM', K_DELAYED, id) == 1 then
      redis.call('HINCRBY', k_group(g), 'd', -1)
    else
      if redis.call('LREM', k_list(cls, g), 1, id) == 1 then count_held(cls, g, -1) end
    end
    refresh(g)
    forget_if_idle(g)
    out[#out + 1] = id
    out[#out + 1] = value
  end
end
return out
