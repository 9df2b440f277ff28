-- Shared by every script (inserted where a script says `-- @include common`).
-- KEYS[1] is the fair queue's prefix "<ns>:{<queue>}"; every key below carries its hash
-- tag, so one script only ever touches one Redis Cluster slot. keys.py mirrors this layout.
local prefix = KEYS[1]
local K_MSG = prefix .. ':msg'          -- HASH hold id -> stored value (envelope.py)
local K_STAT = prefix .. ':stat'        -- HASH inflight (total), dup (id collision counter)
local K_VT = prefix .. ':vt'            -- HASH class -> virtual time
local K_CONF = prefix .. ':conf'        -- HASH cap (-1: none), reserve, weight
local K_CAPS = prefix .. ':caps'        -- HASH group -> cap override
local K_WEIGHTS = prefix .. ':weights'  -- HASH group -> weight override
local K_GROUPS = prefix .. ':groups'    -- SET groups with held, delayed or in-flight work
local K_DELAYED = prefix .. ':delayed'  -- ZSET hold id -> due time (ms)
local K_LEASES = prefix .. ':leases'    -- ZSET dispatch id -> lease deadline (ms)
local K_WAKE = prefix .. ':wake'        -- LIST of at most one marker: dispatchers BLPOP it

local CLASSES = {'i', 'b'}               -- interactive first

local function k_list(cls, g) return prefix .. ':q:' .. cls .. ':' .. g end
local function k_group(g) return prefix .. ':g:' .. g end
local function k_ready(cls) return prefix .. ':ready:' .. cls end
local function k_dispatch(did) return prefix .. ':d:' .. did end

-- The stored value's prefix: <class><front><cost>:<glen>:<group> (see envelope.py).
local function parse(v)
  local cls = string.sub(v, 1, 1)
  local front = string.sub(v, 2, 2) == '1'
  local p1 = string.find(v, ':', 3, true)
  local cost = tonumber(string.sub(v, 3, p1 - 1))
  local p2 = string.find(v, ':', p1 + 1, true)
  local glen = tonumber(string.sub(v, p1 + 1, p2 - 1))
  return cls, front, cost, string.sub(v, p2 + 1, p2 + glen)
end

local function wake()
  if redis.call('LLEN', K_WAKE) == 0 then redis.call('LPUSH', K_WAKE, '1') end
end

local function inflight_of(g)
  return tonumber(redis.call('HGET', k_group(g), 'n') or '0')
end

-- A group may be picked in a class while it holds work there and is under its cap;
-- interactive work may also use the reserve above the cap.
local function eligible(cls, g, n)
  if redis.call('LLEN', k_list(cls, g)) == 0 then return false end
  local cap = tonumber(redis.call('HGET', K_CAPS, g) or redis.call('HGET', K_CONF, 'cap') or '-1')
  if cap < 0 then return true end
  if cls == 'i' then cap = cap + tonumber(redis.call('HGET', K_CONF, 'reserve') or '0') end
  return n < cap
end

-- Make g's membership of each ready set match its eligibility. A group entering a ready
-- set starts at the class's virtual time: no credit for having been idle.
-- Returns true when g entered a ready set it was not in.
local function refresh(g)
  local gk = k_group(g)
  local n = inflight_of(g)
  local entered = false
  for _, cls in ipairs(CLASSES) do
    if eligible(cls, g, n) then
      local tag = tonumber(redis.call('HGET', gk, 't' .. cls) or '0')
      local vt = tonumber(redis.call('HGET', K_VT, cls) or '0')
      if vt > tag then
        tag = vt
        redis.call('HSET', gk, 't' .. cls, tag)
      end
      if redis.call('ZADD', k_ready(cls), tag, g) == 1 then entered = true end
    else
      redis.call('ZREM', k_ready(cls), g)
    end
  end
  return entered
end

-- Forget a group that holds nothing, waits for nothing and runs nothing.
local function forget_if_idle(g)
  local gk = k_group(g)
  if inflight_of(g) > 0 or tonumber(redis.call('HGET', gk, 'd') or '0') > 0 then return end
  for _, cls in ipairs(CLASSES) do
    if redis.call('LLEN', k_list(cls, g)) > 0 then return end
  end
  redis.call('DEL', gk)
  redis.call('SREM', K_GROUPS, g)
end

-- One slot of g comes back (release, reclaim).
local function free_slot(g)
  redis.call('HINCRBY', k_group(g), 'n', -1)
  redis.call('HINCRBY', K_STAT, 'inflight', -1)
  refresh(g)
  forget_if_idle(g)
end

-- A worker holds dispatch `did`: mark it running and extend its lease. A dispatch whose
-- slot was reclaimed ('lost') takes a slot again. Returns the state it was in, or false.
local function take(did, deadline)
  local dk = k_dispatch(did)
  local state = redis.call('HGET', dk, 's')
  if not state or state == 'superseded' then return state or false end
  if state == 'lost' then
    local g = redis.call('HGET', dk, 'g')
    redis.call('HINCRBY', k_group(g), 'n', 1)
    redis.call('HINCRBY', K_STAT, 'inflight', 1)
    redis.call('SADD', K_GROUPS, g)
    redis.call('PERSIST', dk)
    refresh(g)
  end
  if state ~= 'running' then
    redis.call('HSET', dk, 's', 'running')
    redis.call('HDEL', dk, 'v')
  end
  redis.call('ZADD', K_LEASES, deadline, did)
  return state
end
