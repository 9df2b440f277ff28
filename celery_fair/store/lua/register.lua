--[[ register: a worker consuming the fair queue is alive until a time (registry.py).
A worker not registered, or whose registration expired, is a newcomer: it records its
start time and takes the lowest slot no live worker holds; a live worker keeps both.
Entries expired before ARGV[5] are dropped (from both hashes), the worker's own
as just written too.
KEYS[1]  fair queue prefix
ARGV[1]  worker (hostname)
ARGV[2]  its pool size
ARGV[3]  its registration expires at (ms)
ARGV[4]  now (ms, the caller's clock)
ARGV[5]  drop entries expired before this (ms)
Returns: 1 when the worker was not in the hash (the caller wakes the dispatchers), else 0.
The `workers` hash keeps its '<expires>:<pool>' values, which older versions parse. ]]
-- @include common
local worker, now = ARGV[1], tonumber(ARGV[4])
local was = redis.call('HGET', K_WORKERS, worker)
local meta = redis.call('HGET', K_WMETA, worker)
local taken, dead = {}, {}
local entries = redis.call('HGETALL', K_WORKERS)
for i = 1, #entries, 2 do
  local expires = tonumber(string.match(entries[i + 1], '^(%-?%d+):'))
  if expires < tonumber(ARGV[5]) then
    dead[#dead + 1] = entries[i]
  elseif expires >= now and entries[i] ~= worker then
    local m = redis.call('HGET', K_WMETA, entries[i])
    local slot = m and string.match(m, ':(%d+)$')
    if slot then taken[tonumber(slot)] = true end
  end
end
local live = was and meta and tonumber(string.match(was, '^(%-?%d+):')) >= now
if not live then
  local slot = 0
  while taken[slot] do slot = slot + 1 end
  redis.call('HSET', K_WMETA, worker, ARGV[4] .. ':' .. slot)
end
redis.call('HSET', K_WORKERS, worker, ARGV[3] .. ':' .. ARGV[2])
if tonumber(ARGV[3]) < tonumber(ARGV[5]) then dead[#dead + 1] = worker end  -- as written
for _, w in ipairs(dead) do
  if w ~= worker or tonumber(ARGV[3]) < tonumber(ARGV[5]) then
    redis.call('HDEL', K_WORKERS, w)
    redis.call('HDEL', K_WMETA, w)
  end
end
if was then return 0 end
return 1
