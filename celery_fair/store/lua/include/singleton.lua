-- singleton: singleton keys (needs common; DESIGN.md "Singleton keys"). At most one
-- message of a key is out of its waiting list at a time, across the namespace's fair
-- queues (the app; one queue on Redis Cluster): the key's owner, listed in its group (or
-- handed to its queue, which lists it at its next promote), or in flight. The others
-- wait in the key's list, in order, in no group's list: they block neither their group
-- nor anything else. When the owner's dispatch ends (release), loses its slot (reclaim)
-- or the owner is cancelled, the next waiter owns the key: one of this queue enters its
-- group's list at the head of its class (it waited its turn already); one of another
-- queue is put in that queue's "to admit" list and its dispatchers woken (a script
-- cannot list it: every key name below is bound to this queue's prefix).
-- Owners and waiters are refs "<queue>\31<id>" (policy/singletons.py `ref`).
-- One table (pick.lua is near Lua's 200 locals): app scope (scripts.py sets it false
-- for Redis Cluster: a script reaches one slot), namespace, queue, the scope's prefix.
local SG = {app = true}
SG.ns, SG.queue = string.match(prefix, '^(.-):{(.*)}$')
SG.prefix = SG.app and (SG.ns .. ':singleton') or prefix
local K_SKEY = prefix .. ':skey'      -- HASH hold id -> singleton key (held with a key)
local K_SOWNER = SG.prefix .. ':sowner'  -- HASH key -> 'h'<ref> owner held, 'd'<ref> in flight
local function k_swait(key) return SG.prefix .. ':sw:' .. key end  -- LIST waiting refs
-- LIST hold ids of queue `q` that own their key and enter their group at its promote
function SG.sadmit(q) return SG.prefix .. ':sadmit:' .. q end
function SG.ref(id) return SG.queue .. '\31' .. id end
function SG.unref(r)
  local q, id = string.match(r, '^(.-)\31(.*)$')
  if not q then return SG.queue, r end
  return q, id
end

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
  if redis.call('HSETNX', K_SOWNER, key, 'h' .. SG.ref(id)) == 1 then return true end
  if front then redis.call('LPUSH', k_swait(key), SG.ref(id))
  else redis.call('RPUSH', k_swait(key), SG.ref(id)) end
  return false
end

-- Waiter `id` (held, decoded `m`) of this queue enters its group at the head of its class.
function SG.list(id, m, now)
  redis.call('SADD', K_GROUPS, m.g)
  push_held(m.cls, m.g, id, true, now)
  count_held(m.cls, m.g, 1)
  if refresh(m.g) then wake() end
end

-- The key's next waiter owns the key: one of this queue enters its group's list at the
-- head of its class, one of another is handed to its queue; with none the key is free.
-- A waiter of this queue without its message (gone) is skipped, an undecodable one
-- quarantined.
local function singleton_next(key, now)
  while true do
    local r = redis.call('LPOP', k_swait(key))
    if not r then
      redis.call('HDEL', K_SOWNER, key)
      return
    end
    local q, id = SG.unref(r)
    if q ~= SG.queue then
      redis.call('HSET', K_SOWNER, key, 'h' .. r)
      redis.call('RPUSH', SG.sadmit(q), id)
      local marker = SG.ns .. ':{' .. q .. '}:wake'  -- wake(), for that queue
      if redis.call('LLEN', marker) == 0 then redis.call('LPUSH', marker, '1') end
      return
    end
    local value = redis.call('HGET', K_MSG, id)
    local m = value and decode(value)
    if m then
      redis.call('HSET', K_SOWNER, key, 'h' .. SG.ref(id))
      SG.list(id, m, now)
      return
    end
    redis.call('HDEL', K_SKEY, id)
    if value then quarantine(id, value, 'singleton: undecodable stored value') end
  end
end

-- Promote: the waiters other queues handed this one enter their groups (one cancelled
-- meanwhile is skipped; one whose message is gone passes its key on). Returns how many.
function SG.admitted(now)
  if not SG.app then return 0 end
  local n = 0
  while true do
    local id = redis.call('LPOP', SG.sadmit(SG.queue))
    if not id then return n end
    local key = redis.call('HGET', K_SKEY, id)
    if key and redis.call('HGET', K_SOWNER, key) == 'h' .. SG.ref(id) then
      local value = redis.call('HGET', K_MSG, id)
      local m = value and decode(value)
      if m then
        SG.list(id, m, now)
        n = n + 1
      else
        redis.call('HDEL', K_SKEY, id)
        if value then quarantine(id, value, 'singleton: undecodable stored value') end
        singleton_next(key, now)
      end
    end
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
  redis.call('HSET', K_SOWNER, key, 'd' .. SG.ref(did))
  redis.call('HSET', k_dispatch(did), 'k', key)
end

-- Dispatch `did` of `key` ended or lost its slot: the key passes on (only when that
-- dispatch still owns it).
local function singleton_ended(key, did, now)
  if key and redis.call('HGET', K_SOWNER, key) == 'd' .. SG.ref(did) then
    singleton_next(key, now)
  end
end

-- Reclaim holds dispatch `did` of `key` again as hold id `id`: true when it enters its
-- group's list (it keeps the key), false when it waits at the head of the key's list
-- (the key passed on meanwhile).
local function singleton_requeued(key, did, id)
  redis.call('HSET', K_SKEY, id, key)
  if redis.call('HGET', K_SOWNER, key) == 'd' .. SG.ref(did) then
    redis.call('HSET', K_SOWNER, key, 'h' .. SG.ref(id))
    return true
  end
  return singleton_enter(id, key, true)
end

-- Held `id` is removed (cancel): out of its key's list, or, as the key's owner (listed
-- or to admit), the key passes on. Returns its key, or nil.
local function singleton_removed(id, now)
  if not singleton_any() then return nil end
  local key = redis.call('HGET', K_SKEY, id)
  if not key then return nil end
  redis.call('HDEL', K_SKEY, id)
  if redis.call('HGET', K_SOWNER, key) == 'h' .. SG.ref(id) then
    if SG.app then redis.call('LREM', SG.sadmit(SG.queue), 0, id) end
    singleton_next(key, now)
  else
    redis.call('LREM', k_swait(key), 1, SG.ref(id))
  end
  return key
end

-- Whether held `id` waits for its key, or to be admitted (check: not an orphan).
local function singleton_waiting(id)
  if not singleton_any() then return false end
  local key = redis.call('HGET', K_SKEY, id)
  if key == false or key == nil then return false end
  return redis.call('LPOS', k_swait(key), SG.ref(id)) ~= false
    or (SG.app and redis.call('LPOS', SG.sadmit(SG.queue), id) ~= false)
end
