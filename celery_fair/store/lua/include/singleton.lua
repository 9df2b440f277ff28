-- singleton: singleton keys (needs common; DESIGN.md "Singleton keys"). At most one
-- message of a key is out of its waiting list at a time: the key's owner, listed in its
-- group (not picked yet) or in flight. The others wait in the key's list, in order, in
-- no group's list: they block neither their group nor anything else. When the owner's
-- dispatch ends (release), loses its slot (reclaim) or the owner is cancelled, the next
-- waiter enters its group's list at the head of its class (it waited its turn already).
local K_SKEY = prefix .. ':skey'      -- HASH hold id -> singleton key (held with a key)
local K_SOWNER = prefix .. ':sowner'  -- HASH key -> 'h'<hold id> listed, 'd'<dispatch id> in flight
local function k_swait(key) return prefix .. ':sw:' .. key end  -- LIST waiting hold ids

-- Whether any message is held with a key (read once per call: none, no read per message).
local singleton_seen = nil
local function singleton_any()
  if singleton_seen == nil then singleton_seen = redis.call('HLEN', K_SKEY) > 0 end
  return singleton_seen
end

-- singleton_mode 'drop': whether `key` has a message waiting (its owner not picked yet,
-- or one in its waiting list); then a new one is not held.
local function singleton_drops(key)
  local owner = redis.call('HGET', K_SOWNER, key)
  if not owner then return false end
  return string.sub(owner, 1, 1) == 'h' or redis.call('LLEN', k_swait(key)) > 0
end

-- Hold id `id` of `key` is about to enter its group's list: true when it may (it owns
-- the key now), false when it waits (at the head of the key's list when `front`: a
-- retry of the key's task goes next).
local function singleton_enter(id, key, front)
  redis.call('HSET', K_SKEY, id, key)
  singleton_seen = true
  if redis.call('HSETNX', K_SOWNER, key, 'h' .. id) == 1 then return true end
  if front then redis.call('LPUSH', k_swait(key), id) else redis.call('RPUSH', k_swait(key), id) end
  return false
end

-- The key's next waiter enters its group's list at the head of its class and owns the
-- key; with none the key is free. A waiter without its message (gone) is skipped, an
-- undecodable one quarantined.
local function singleton_next(key, now)
  while true do
    local id = redis.call('LPOP', k_swait(key))
    if not id then
      redis.call('HDEL', K_SOWNER, key)
      return
    end
    local value = redis.call('HGET', K_MSG, id)
    local m = value and decode(value)
    if m then
      redis.call('HSET', K_SOWNER, key, 'h' .. id)
      redis.call('SADD', K_GROUPS, m.g)
      push_held(m.cls, m.g, id, true, now)
      count_held(m.cls, m.g, 1)
      if refresh(m.g) then wake() end
      return
    end
    redis.call('HDEL', K_SKEY, id)
    if value then quarantine(id, value, 'singleton: undecodable stored value') end
  end
end

-- The wall clock in ms, for a release (it is given none): the head time of a waiter
-- that enters its list.
local function singleton_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Hold id `id` was picked as dispatch `did`: its key (if any) goes with the record
-- (field `k`) and is owned by the dispatch until it ends.
local function singleton_picked(id, did)
  if not singleton_any() then return end
  local key = redis.call('HGET', K_SKEY, id)
  if not key then return end
  redis.call('HDEL', K_SKEY, id)
  redis.call('HSET', K_SOWNER, key, 'd' .. did)
  redis.call('HSET', k_dispatch(did), 'k', key)
end

-- Dispatch `did` of `key` ended or lost its slot: the key passes on (only when that
-- dispatch still owns it).
local function singleton_ended(key, did, now)
  if key and redis.call('HGET', K_SOWNER, key) == 'd' .. did then singleton_next(key, now) end
end

-- Reclaim holds dispatch `did` of `key` again as hold id `id`: true when it enters its
-- group's list (it keeps the key), false when it waits at the head of the key's list
-- (the key passed on meanwhile).
local function singleton_requeued(key, did, id)
  redis.call('HSET', K_SKEY, id, key)
  if redis.call('HGET', K_SOWNER, key) == 'd' .. did then
    redis.call('HSET', K_SOWNER, key, 'h' .. id)
    return true
  end
  return singleton_enter(id, key, true)
end

-- Held `id` is removed (cancel): out of its key's list, or, as the key's owner, the key
-- passes on. Returns its key, or nil.
local function singleton_removed(id, now)
  if not singleton_any() then return nil end
  local key = redis.call('HGET', K_SKEY, id)
  if not key then return nil end
  redis.call('HDEL', K_SKEY, id)
  if redis.call('HGET', K_SOWNER, key) == 'h' .. id then
    singleton_next(key, now)
  else
    redis.call('LREM', k_swait(key), 1, id)
  end
  return key
end

-- Whether held `id` waits in its key's list (check: not an orphan).
local function singleton_waiting(id)
  if not singleton_any() then return false end
  local key = redis.call('HGET', K_SKEY, id)
  return key ~= false and key ~= nil and redis.call('LPOS', k_swait(key), id) ~= false
end
