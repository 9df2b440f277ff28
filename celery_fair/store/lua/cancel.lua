--[[ cancel: remove held or delayed messages by task id (their task was revoked unrun),
with the copies held under a suffixed id (<id>~<n>, see k_copies), found by their index.
A message already picked, queued or running is not touched: its task id is revoked in
the workers, and its slot comes back through the release receivers.
What a call removes is kept ARGV[1] seconds under the call's token (k_cancelled): the
same call resent after its reply was lost (redis-py retries it) gets the same answer, so
the caller still marks those tasks REVOKED; a new call (another token) finds them gone.
KEYS[1]  fair queue prefix
ARGV[1]  seconds to keep what this call removed, for a resend
ARGV[2]  this call's token (unique per call)
ARGV[3]  now in ms: a removed head stamps its group's head time of its class (`h<class>`)
ARGV[4..] task ids
Returns: flat array {hold id, stored value, ...} of the messages removed. ]]
-- @include common
-- @include singleton
-- @include subcaps
local keep = tonumber(ARGV[1])

-- Removes hold id `id` if held; returns its stored value.
local function remove(id)
  local value = redis.call('HGET', K_MSG, id)
  local m = value and decode(value)
  if value and not m then
    quarantine(id, value, 'cancel: undecodable stored value')
    return nil
  end
  if not m then
    unindex_copy(id)  -- a stale entry of the index (nothing else leaves one)
    return nil
  end
  local cls, g = m.cls, m.g
  redis.call('HDEL', K_MSG, id)
  unindex_copy(id)
  singleton_removed(id, ARGV[3])  -- out of its key's list, or its key passes on
  if redis.call('ZREM', K_DELAYED, id) == 1 then
    redis.call('HINCRBY', k_group(g), 'd', -1)
  else
    local list = k_list(cls, g)
    local was_head = redis.call('LINDEX', list, 0) == id
    if unlist_held(cls, g, id) == 1 then
      count_held(cls, g, -1)
      -- the next message is the head now (a stale time when none: the next in stamps it)
      if was_head then redis.call('HSET', k_group(g), 'h' .. cls, ARGV[3]) end
    elseif redis.call('SCARD', SUBCAPS.parked) > 0
        and SUBCAPS.removed(cls, g, subgroup_of(value), id) == 1 then
      count_held(cls, g, -1)  -- parked (caps per subgroup): still held
    end
  end
  refresh(g)
  forget_if_idle(g)
  return value
end

-- Hold id `id` and the copies held under <id>~..., from its task id's index.
local function held_under(id)
  local ids, head = {id}, id .. '~'
  for _, copy in ipairs(redis.call('SMEMBERS', k_copies(id))) do
    if string.sub(copy, 1, #head) == head then ids[#ids + 1] = copy end
  end
  return ids
end

local kept = k_cancelled(ARGV[2])
if redis.call('EXISTS', kept) == 1 then return redis.call('HGETALL', kept) end  -- a resend
local out, seen = {}, {}
for a = 4, #ARGV do
  for _, id in ipairs(held_under(ARGV[a])) do
    local value = not seen[id] and remove(id)
    seen[id] = true
    if value then
      out[#out + 1] = id
      out[#out + 1] = value
      redis.call('HSET', kept, id, value)
    end
  end
end
if #out > 0 then redis.call('EXPIRE', kept, keep) end
return out
