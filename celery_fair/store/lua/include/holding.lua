-- holding: what hold.lua and hold_many.lua share (needs common). A hold is checked
-- (hold_refusal, room_of, preflight) before its first write (hold_write): a script stopped
-- by an error keeps the writes it made, so every check comes first.

-- The error reply refusing a hold's arguments, or nil when they may be held. Why the
-- prefix is checked against the arguments: pick, promote, cancel and check read the
-- placement back from the stored prefix later; a value whose prefix disagreed would be
-- counted in one group here and in another there. The check is a few string ops, no JSON.
local function hold_refusal(id, value, due, now, g, cls, cost, front)
  if not due or not now or (cls ~= 'i' and cls ~= 'b') or #g == 0 or not cost
     or not (cost > 0 and cost <= MAX_COST) then
    return 'ERR hold ' .. id .. ': a time is not a finite number or the placement is ' ..
           'out of range (class i or b, a group, a cost in (0, ' .. MAX_COST .. '])'
  end
  local m = decode(value)
  if not m or m.g ~= g or m.cls ~= cls or m.cost ~= cost or m.front ~= front then
    return 'CORRUPT hold ' .. id .. ': the stored value\'s prefix is not envelope.py\'s ' ..
           'encoding of the placement given (class, front, cost, group)'
  end
end

-- How many messages group g holds: both classes' lists, its delayed ones and those
-- parked behind a capped-out subgroup (caps per subgroup: held all the same).
local function held_of(g)
  local delayed, parked = unpack(redis.call('HMGET', k_group(g), 'd', 'pk'))
  return redis.call('LLEN', k_list('i', g)) + redis.call('LLEN', k_list('b', g))
         + tonumber(delayed or '0') + tonumber(parked or '0')
end

-- Read every key a hold of group g writes: one of a foreign type fails the script here,
-- before its first write (a hold is all or nothing: never a held count without its
-- message). Returns, for a message held now (not delayed), what was read that the
-- refresh after the hold needs (refresh's `known`): the hold changes none of it but its
-- own list's length, which hold_write sets.
local function preflight(g, delayed, id)
  redis.call('HGET', K_STAT, 'dup')
  redis.call('SISMEMBER', K_GROUPS, g)
  local known = {n = tonumber(redis.call('HGET', k_group(g), 'n') or '0')}
  if delayed then
    redis.call('ZSCORE', K_DELAYED, id)
    return
  end
  redis.call('ZSCORE', K_BACKLOG, g)
  known.vt_i, known.vt_b = unpack(redis.call('HMGET', K_VT, 'i', 'b'))
  for _, c in ipairs(CLASSES) do
    known['len_' .. c] = redis.call('LLEN', k_list(c, g))
    known['in_' .. c] = redis.call('ZSCORE', k_ready(c), g)  -- false: not in it
  end
  known.cap = valid_cap(redis.call('HGET', K_CAPS, g))  -- cap_of's
  if not known.cap then  -- the default cap, and the cap mode with it (soft_caps())
    local conf_cap, capmode = unpack(redis.call('HMGET', K_CONF, 'cap', 'capmode'))
    if soft_read == nil then soft_read = capmode == 'soft' end
    known.cap = valid_cap(conf_cap) or -1
  end
  redis.call('LLEN', K_WAKE)
  return known
end

-- Keep the message (checked); `held`: a message is held under id already, so this one
-- is a copy under a suffixed id. Returns the hold id used. Wakes dispatchers when the
-- group became ready or the message is the next one due. `known`: preflight's answer.
-- `key`: its singleton key (nil: none; needs the singleton include): a delayed one
-- passes the key's gate at promote, one held now here (it may wait in the key's list).
-- `defer`: the wake-up for a group that became ready is the caller's (the second value
-- returned: true when due), which may push the message itself first (hold.lua's refill).
local function hold_write(id, value, held, due, now, g, cls, front, known, key, defer)
  if held then
    id = id .. '~' .. redis.call('HINCRBY', K_STAT, 'dup', 1)
    index_copy(id)  -- so cancel finds it
  end
  redis.call('HSET', K_MSG, id, value)
  -- a message waiting for its key is in no group: its group is not touched (an idle one
  -- stays forgotten until the message enters it)
  if key and due <= now and not singleton_enter(id, key, front) then return id end
  redis.call('SADD', K_GROUPS, g)
  if due > now then
    redis.call('ZADD', K_DELAYED, due, id)
    redis.call('HINCRBY', k_group(g), 'd', 1)
    if redis.call('ZRANGE', K_DELAYED, 0, 0)[1] == id then wake() end
    if key then redis.call('HSET', K_SKEY, id, key) end
    return id
  end
  local len = push_held(cls, g, id, front, now)
  count_held(cls, g, 1)
  if known then known['len_' .. cls] = len end
  if refresh(g, nil, known) then
    if defer then return id, true end
    wake()
  end
  return id
end

-- A resend (the same message published again after the caller was told
-- HoldOutcomeUnknown or HoldNotReplicated) is held once, even after the first was picked
-- or has run: k_sent(task id) keeps, for `remember` seconds, the sha1 of the message but
-- for its hold time (the meta's "t", first in it: envelope.py; a resend is made again,
-- so only that differs) and the hold id it got. Another message under the task id (a
-- retry: its retries count differs) is held.
local function sent_digest(value)
  local from, to = string.find(value, '{"t": ?[-%d.eE+]*')
  return redis.sha1hex(from and (string.sub(value, 1, from) .. string.sub(value, to + 1))
                       or value)
end

-- The hold id the same message got under task id `id` (nil: none remembered). Read
-- before any write (a key of a foreign type fails the script here).
local function sent_before(id, digest)
  local last = redis.call('GET', k_sent(id))
  if last and string.sub(last, 1, 40) == digest then return string.sub(last, 42) end
end

local function remember_sent(id, digest, hold_id, seconds)
  redis.call('SET', k_sent(id), digest .. ' ' .. hold_id, 'EX', seconds)
end
