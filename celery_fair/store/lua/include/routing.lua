-- fair_affinity's part of the pick (pick.lua includes it after common): a group's tasks go
-- to the worker the dispatcher assigned it (K_AFF, written by assign.lua: the owners are
-- computed in Python, a 64-bit jump hash Lua cannot do), and only while that worker has
-- a free slot of its own (its pool, plus the dispatch-ahead, less its routed dispatches
-- in flight, K_WFLIGHT). A group whose worker is full waits, unless its head has waited
-- the spill time: then the worker with the most room takes it.
-- The ready sets stay as they are; the pick looks past the groups whose worker is full,
-- in order, and remembers them (and how far the set's front is made of them) for the
-- rest of the call, so a message costs O(log G) plus the groups looked past once per call.
-- fair_group_queues: a target may be a real queue, 'queue:<name>' (group_queues.py), with
-- the pools of the workers consuming it as its limit; the routing is the same, but a group
-- never spills to or from such a target (a dedicated pool is the point of the setting).

-- Most entries of one set looked at for one head (the rest waits for the next call).
local ROUTE_SCAN = 1000
local ROUTE_PAGE = 32

-- The call's routing: `spec` is "<worker>\n<limit>\n..." (the dispatcher's live workers
-- and what each may have in flight), `spill` the spill time in ms (-1: never).
local function routing_of(spec, spill, now)
  local r = {room = {}, order = {}, open = 0, spill = tonumber(spill) or -1, now = now,
             owner = {}, skip = {}, offset = {}, unassigned = {}, host = {}, headed = {}}
  local parts = {}
  for part in string.gmatch(spec, '[^\n]+') do parts[#parts + 1] = part end
  for i = 1, #parts - 1, 2 do r.order[#r.order + 1] = parts[i] end
  if #r.order == 0 then return r end
  local flights = redis.call('HMGET', K_WFLIGHT, unpack(r.order))
  for i, w in ipairs(r.order) do
    r.room[w] = tonumber(parts[2 * i]) - tonumber(flights[i] or '0')
    if r.room[w] > 0 then r.open = r.open + 1 end
  end
  return r
end

-- Whether target `w` is a real queue (fair_group_queues), not a worker.
local function queue_target(w)
  return string.sub(w, 1, 6) == 'queue:'
end

-- The worker with the most room (the first in the dispatcher's order on a tie), or nil.
local function roomiest(r)
  local best, most = nil, 0
  for _, w in ipairs(r.order) do
    if r.room[w] > most and not queue_target(w) then best, most = w, r.room[w] end
  end
  return best
end

-- Where g's next message of class `cls` may go now (nil: it waits). A group without a
-- live worker assigned is left for the dispatcher to assign (r.unassigned).
local function route(r, g, cls)
  local w = r.owner[g]
  if w == nil then
    w = redis.call('HGET', K_AFF, g) or false
    r.owner[g] = w
  end
  if not w or r.room[w] == nil then
    r.unassigned[g] = true
    return nil
  end
  if r.room[w] > 0 then return w end
  if r.spill >= 0 and not queue_target(w) then
    -- a list this call took from has a new head since now: the pick writes its time
    -- at its end (r.headed), so the stored one is stale here
    local since = r.headed[cls .. g] and r.now
      or tonumber(redis.call('HGET', k_group(g), 'h' .. cls) or '')
    if since and r.now - since >= r.spill then return roomiest(r) end
  end
  return nil
end

-- ZRANGE's answer for the head of `key` (class `cls`) among the groups that may go now:
-- {group, score}, or {}. The worker is kept in r.host[cls].
local function routed_top(r, key, cls)
  local start = r.offset[key] or 0
  local size = 1  -- the head alone first: in the common case its worker has room
  while start < ROUTE_SCAN do
    local page = redis.call('ZRANGE', key, start, start + size - 1, 'WITHSCORES')
    for i = 1, #page, 2 do
      local g = page[i]
      local w = not r.skip[cls .. g] and route(r, g, cls)
      if w then
        r.host[cls] = w
        return {g, page[i + 1]}
      end
      r.skip[cls .. g] = true
      -- everything before it was looked past too: the next head starts after it
      if (r.offset[key] or 0) == start + (i - 1) / 2 then r.offset[key] = start + (i + 1) / 2 end
    end
    if #page < 2 * size then return {} end
    start, size = start + size, ROUTE_PAGE
  end
  return {}
end

-- A routed message taken for worker `w`: one slot of its room used.
local function routed_taken(r, w, did)
  redis.call('HSET', k_dispatch(did), 'w', w)
  worker_slot(w, 1)
  r.room[w] = r.room[w] - 1
  if r.room[w] == 0 then r.open = r.open - 1 end
end

-- The groups met without a live worker assigned, for the dispatcher to assign.
local function unassigned_of(r)
  local out = {}
  for g in pairs(r.unassigned) do out[#out + 1] = g end
  return out
end
