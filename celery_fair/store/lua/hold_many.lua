--[[ hold_many: hold.lua for many messages of one fair queue at once, all or nothing.
KEYS[1]  fair queue prefix
ARGV[1]  now in ms
ARGV[2]  seconds to remember what was held under each task id (hold.lua's ARGV[10]):
         a message published again within them is held once, even after the first was
         picked or has run (a BulkHoldFailed retry, or a resend after HoldOutcomeUnknown)
then 9 per message, in order:
  hold id, stored value, due time in ms (0: now), group, class, cost, front ('1'/'0'),
  max held ('': unlimited), singleton key ('': none; hold.lua's ARGV[11], no 'drop')
each as hold.lua's ARGV[1]..ARGV[3] and ARGV[5]..ARGV[9].
Every message is checked before the first write, so the batch is held whole or not at
all: its arguments (as hold.lua), and backpressure per group, counting what the group
holds plus the batch's messages before this one. A message whose very value is held
under its id already (a resend, or twice in the batch), or remembered as held under it
within ARGV[2], is held once and not counted.
Returns: the hold ids used, in order.
Errors (nothing written): FULL <count> <limit> <group> (count: what the group holds plus the
batch's messages of the group before the refused one); CORRUPT and ERR as hold.lua, each
followed by ' (message <n> of the batch)', n counted from 0.
Wakes dispatchers as hold.lua does, and stamps a new head's time as it does. ]]
-- @include common
-- @include singleton
-- @include holding
local FIELDS, FIRST = 9, 2
local now, remember = finite(ARGV[1]), tonumber(ARGV[2]) or 0
local count = (#ARGV - FIRST) / FIELDS
if not now or count ~= math.floor(count) then
  return redis.error_reply('ERR hold_many: expected now, the seconds to remember, then ' ..
                           FIELDS .. ' arguments per message')
end

local items, held_now, checked = {}, {}, {}
for i = 1, count do
  local b = FIRST + (i - 1) * FIELDS
  local it = {id = ARGV[b + 1], value = ARGV[b + 2], due = finite(ARGV[b + 3]),
              g = ARGV[b + 4], cls = ARGV[b + 5], cost = tonumber(ARGV[b + 6]),
              front = ARGV[b + 7] == '1', max_held = tonumber(ARGV[b + 8]),
              key = ARGV[b + 9] ~= '' and ARGV[b + 9] or nil}
  local refused = hold_refusal(it.id, it.value, it.due, now, it.g, it.cls, it.cost, it.front)
  if refused then
    return redis.error_reply(refused .. ' (message ' .. (i - 1) .. ' of the batch)')
  end
  it.held = redis.call('HGET', K_MSG, it.id)
  if it.held ~= it.value and remember > 0 then
    it.digest = sent_digest(it.value)
    it.earlier = sent_before(it.id, it.digest)
  end
  if it.held ~= it.value and not it.earlier then  -- not a resend: new work
    if held_now[it.g] == nil then held_now[it.g] = held_of(it.g) end
    if it.max_held and held_now[it.g] >= it.max_held then
      return redis.error_reply('FULL ' .. held_now[it.g] .. ' ' .. ARGV[b + 8] ..
                               ' ' .. it.g)
    end
    held_now[it.g] = held_now[it.g] + 1
  end
  local delayed = it.due > now
  local seen = it.g .. (delayed and '\0d' or '\0n')
  if not checked[seen] then
    preflight(it.g, delayed, it.id)
    checked[seen] = true
  end
  items[i] = it
end

-- The writes of hold_write, message by message where they differ (a copy's suffix, the
-- list, the delayed set), and once per group and class where one call does the same as
-- many (the held counts, the groups set, refresh): the same state as the holds one by
-- one, with a few calls per message instead of twenty.
local out, groups, pushed, counts, delayed, written = {}, {}, {}, {}, {}, {}
for i, it in ipairs(items) do
  local held = written[it.id] or it.held  -- what HGET would answer now
  local id = it.earlier or it.id
  if held ~= it.value and not it.earlier then
    if held then
      id = id .. '~' .. redis.call('HINCRBY', K_STAT, 'dup', 1)
      index_copy(id)  -- so cancel finds it
    end
    redis.call('HSET', K_MSG, id, it.value)
    if id == it.id then written[id] = it.value end
    local waits = it.key and it.due <= now and not singleton_enter(id, it.key, it.front)
    if not waits and not groups[it.g] then groups[it.g] = true; groups[#groups + 1] = it.g end
    if waits then
      -- waits in its key's list (include/singleton.lua), in no group
    elseif it.due > now then
      redis.call('ZADD', K_DELAYED, it.due, id)
      redis.call('HINCRBY', k_group(it.g), 'd', 1)
      delayed[id] = true
      if it.key then redis.call('HSET', K_SKEY, id, it.key) end
    else
      push_held(it.cls, it.g, id, it.front, ARGV[1])
      local key = it.cls .. ':' .. it.g
      if not counts[key] then pushed[#pushed + 1] = {it.cls, it.g}; counts[key] = 0 end
      counts[key] = counts[key] + 1
    end
    if it.digest then remember_sent(it.id, it.digest, id, remember) end
  end
  out[i] = id
end
for _, g in ipairs(groups) do redis.call('SADD', K_GROUPS, g) end
local refreshed = {}
for _, p in ipairs(pushed) do
  count_held(p[1], p[2], counts[p[1] .. ':' .. p[2]])
  if not refreshed[p[2]] then
    refreshed[p[2]] = true
    if refresh(p[2]) then wake() end
  end
end
if next(delayed) and delayed[redis.call('ZRANGE', K_DELAYED, 0, 0)[1]] then wake() end
return out
