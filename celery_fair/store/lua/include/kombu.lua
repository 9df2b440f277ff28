-- kombu's Redis transport message, built in the script (pick.lua's direct push). Mirrors
-- kombu.transport.virtual.Channel.prepare_message / _inplace_augment_message and
-- kombu.transport.redis.Channel._put / _q_for_pri. Headers and properties are spliced as
-- JSON text, never decoded and re-encoded; the fields added are appended, so they win over
-- stale copies, as when the dispatcher sets them in Python.

-- filled at the first base64 of a call: release.lua and hold.lua include this for their
-- refill, and most of their calls push nothing
local B64 = {}

local function base64(s)
  if not B64[0] then
    local alphabet = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/'
    for i = 1, 64 do B64[i - 1] = string.sub(alphabet, i, i) end
  end
  local out, n, len = {}, 0, #s
  for i = 1, len - 2, 3 do
    local a, b, c = string.byte(s, i, i + 2)
    local v = a * 65536 + b * 256 + c
    n = n + 1
    out[n] = B64[math.floor(v / 262144)] .. B64[math.floor(v / 4096) % 64] ..
      B64[math.floor(v / 64) % 64] .. B64[v % 64]
  end
  local rest = len % 3
  if rest > 0 then
    local a, b = string.byte(s, len - rest + 1, len)
    local v = a * 65536 + (b or 0) * 256
    out[n + 1] = B64[math.floor(v / 262144)] .. B64[math.floor(v / 4096) % 64] ..
      (rest == 2 and B64[math.floor(v / 64) % 64] or '=') .. '='
  end
  return table.concat(out)
end

-- A JSON object's text with more "key": value fields at its end.
local function with_fields(object, fields)
  if object == '{}' then return '{' .. fields .. '}' end
  return string.sub(object, 1, -2) .. ', ' .. fields .. '}'
end

-- The parts of a stored value (envelope.py): meta (decoded), headers and properties (JSON
-- text), body. nil for a value stored before headers had a part of their own.
local function envelope_parts(value)
  local p0 = string.find(value, ':', 3, true)
  local p1 = string.find(value, ':', p0 + 1, true)
  local start = p1 + 1 + tonumber(string.sub(value, p0 + 1, p1 - 1))
  local n1 = string.find(value, '\n', start, true)
  local n2 = n1 and string.find(value, '\n', n1 + 1, true)
  local n3 = n2 and string.find(value, '\n', n2 + 1, true)
  if not n3 then return nil end
  local ok, meta = pcall(cjson.decode, string.sub(value, start, n1 - 1))
  if not ok or type(meta) ~= 'table' or meta.h ~= nil then return nil end
  return meta, string.sub(value, n1 + 1, n2 - 1), string.sub(value, n2 + 1, n3 - 1),
    string.sub(value, n3 + 1)
end

-- kombu's JSON for one publish of these parts as dispatch `did` to fair queue `queue`,
-- whose lease runs to `lease_until` (ms): the `fair_lease_until` header, by which a worker
-- with fair_quick_start may skip begin's round trip (lifecycle.starts_quickly)
local function kombu_message(did, queue, meta, headers, properties, body, lease_until)
  local mode = meta.dm  -- kombu.entity.maybe_delivery_mode: persistent unless told
  if mode == 'transient' then mode = 1
  elseif type(mode) ~= 'number' or mode == 0 then mode = 2 end
  local priority = type(meta.pr) == 'number' and meta.pr or 0
  return '{"body": "' .. base64(body) ..
    '", "content-encoding": ' .. cjson.encode(meta.ce) ..
    ', "content-type": ' .. cjson.encode(meta.ct) ..
    ', "headers": ' .. with_fields(headers, '"fair_dispatch_id": "' .. did ..
      '", "fair_queue": ' .. cjson.encode(queue) ..
      ', "fair_lease_until": ' .. string.format('%d', lease_until)) ..
    ', "properties": ' .. with_fields(properties,
      '"delivery_mode": ' .. mode .. ', "priority": ' .. priority ..
      ', "delivery_info": {"exchange": ' .. cjson.encode(meta.e) ..
      ', "routing_key": ' .. cjson.encode(meta.r) ..
      '}, "body_encoding": "base64", "delivery_tag": "' .. did .. '"') .. '}', priority
end

-- kombu's list for a message of this priority: the queue, or "<queue><sep><step>".
local function kombu_list(queue, sep, steps, priority)
  local p = math.max(math.min(math.floor(tonumber(priority) or 0), 9), 0)
  local step = steps[1] or 0
  for _, s in ipairs(steps) do if s <= p then step = s end end
  if step == 0 then return queue end
  return queue .. sep .. step
end
