-- Caps per subgroup (policy/subcaps.py): included after common, where a script parks,
-- unparks or counts a subgroup's flight. Fields of common's SUBCAPS (no new locals).

-- caps per subgroup: the ids of g's class list parked while subgroup sg is at its cap
function SUBCAPS.key(cls, g, sg) return prefix .. ':pk:' .. cls .. ':' .. g .. '/' .. sg end

-- Caps per subgroup (policy/subcaps.py). Room left under the cap of `path`
-- ("<group>/<subgroup>"), nil when no cap binds it (none, or not under 'path').
function SUBCAPS.room(path)
  if not subgroups() then return nil end
  local cap = valid_cap(redis.call('HGET', K_CAPS, path))
  if not cap or cap < 0 then return nil end
  return math.max(cap - tonumber(redis.call('HGET', SUBCAPS.flight, path) or '0'), 0)
end

-- A dispatch of subgroup sg of g (its record's `sg`) leaves the flight (delta -1) or
-- enters it (1).
function SUBCAPS.count(g, sg, delta)
  if not sg or sg == '' then return end
  local path = g .. '/' .. sg
  if redis.call('HINCRBY', SUBCAPS.flight, path, delta) <= 0 then redis.call('HDEL', SUBCAPS.flight, path) end
end

-- How many ids g's class list has parked (every subgroup's): for counts (check,
-- summarize), which still count parked work as held.
function SUBCAPS.held(cls, g)
  local n, head = 0, cls .. ':' .. g .. '/'
  for _, member in ipairs(redis.call('SMEMBERS', SUBCAPS.parked)) do
    if string.sub(member, 1, #head) == head then
      n = n + redis.call('LLEN', SUBCAPS.key(cls, g, string.sub(member, #head + 1)))
    end
  end
  return n
end

-- Dispatch `did` of g carries stored value `v` (pick): its subgroup (none: '') in its
-- record (`sg`) and in that subgroup's flight.
function SUBCAPS.picked(g, v, did)
  local sg = subgroup_of(v)
  if sg == '' then return end
  redis.call('HSET', k_dispatch(did), 'sg', sg)
  SUBCAPS.count(g, sg, 1)
end

-- Subgroup sg of g may have room: as many of its parked ids as the room (all when no cap
-- binds it) back to the front of their class list, in order; the list's head time is
-- left as it is. `_unpark`'s counterpart.
function SUBCAPS.unpark(g, sg)
  local path = g .. '/' .. sg
  local room = SUBCAPS.room(path)
  local moved = false
  for _, cls in ipairs(CLASSES) do
    local pk = SUBCAPS.key(cls, g, sg)
    local len = room ~= 0 and redis.call('LLEN', pk) or 0
    if len > 0 then
      local n = room and math.min(room, len) or len
      local ids = redis.call('LRANGE', pk, 0, n - 1)
      if n == len then
        redis.call('DEL', pk)
        redis.call('SREM', SUBCAPS.parked, cls .. ':' .. path)
      else
        redis.call('LTRIM', pk, n, -1)
      end
      for i = n, 1, -1 do redis.call('LPUSH', k_list(cls, g), ids[i]) end
      redis.call('HINCRBY', k_group(g), 'pk', -n)
      if room then room = room - n end
      moved = true
    end
  end
  if moved and refresh(g) then wake() end
end

-- A dispatch of g with record field `sg` left the flight (release, reclaim): unpark
-- what its subgroup has room for now.
function SUBCAPS.freed(g, sg)
  if not sg or sg == '' then return end
  SUBCAPS.count(g, sg, -1)
  if redis.call('SCARD', SUBCAPS.parked) > 0 then SUBCAPS.unpark(g, sg) end
end

-- A subgroup's parked list holding `id` (a cancel): the id out of it; 1 when it was.
function SUBCAPS.removed(cls, g, sg, id)
  local pk = SUBCAPS.key(cls, g, sg)
  if redis.call('LREM', pk, 1, id) == 0 then return 0 end
  if redis.call('LLEN', pk) == 0 then redis.call('SREM', SUBCAPS.parked, cls .. ':' .. g .. '/' .. sg) end
  redis.call('HINCRBY', k_group(g), 'pk', -1)
  return 1
end
