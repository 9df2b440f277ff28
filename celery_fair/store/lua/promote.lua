--[[ promote: move delayed messages (ETA, countdown, retry) that are due into their group.
A retry enters at the head of its group, anything else at the tail.
KEYS[1]  fair queue prefix
ARGV[1]  now in ms
ARGV[2]  most messages to move
Returns: {moved, due time in ms of the next delayed message or -1, {quarantined ids}}:
a due message that cannot be decoded moves to `quarantine` instead. ]]
-- @include common
local now, limit = tonumber(ARGV[1]), tonumber(ARGV[2])
local moved, bad = 0, {}
for _, id in ipairs(redis.call('ZRANGEBYSCORE', K_DELAYED, '-inf', now, 'LIMIT', 0, limit)) do
  redis.call('ZREM', K_DELAYED, id)
  local value = redis.call('HGET', K_MSG, id)
  local m = value and decode(value)
  if value and not m then
    quarantine(id, value, 'promote: undecodable stored value')
    bad[#bad + 1] = id
  elseif m then
    local cls, front, g = m.cls, m.front, m.g
    if front then
      redis.call('LPUSH', k_list(cls, g), id)
    else
      redis.call('RPUSH', k_list(cls, g), id)
    end
    redis.call('HINCRBY', k_group(g), 'd', -1)
    count_held(cls, g, 1)
    refresh(g)
    moved = moved + 1
  end
end
local nxt = redis.call('ZRANGE', K_DELAYED, 0, 0, 'WITHSCORES')[2]
return {moved, nxt and tonumber(nxt) or -1, bad}
