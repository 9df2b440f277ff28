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
  if value then
    local cls, _, _, g = parse(value)
    redis.call('HDEL', K_MSG, id)
    if redis.call('ZREM', K_DELAYED, id) == 1 then
      redis.call('HINCRBY', k_group(g), 'd', -1)
    else
      redis.call('LREM', k_list(cls, g), 1, id)
    end
    refresh(g)
    forget_if_idle(g)
    out[#out + 1] = id
    out[#out + 1] = value
  end
end
return out
