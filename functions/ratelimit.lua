#!lua name=ratelimit
--[[
ratelimit: five rate-limiting algorithms as one Valkey / Redis Functions library.

Contract (major version 1; see DESIGN.md):
  * every limiter takes exactly one key, KEYS[1], which holds all of its state;
  * ARGV numbers are decimal integers, durations are milliseconds, rates are `rate` units per
    `period_ms`;
  * every limiter and peek replies with six integers:
      {allowed, limit, remaining, retry_after_ms, reset_after_ms, delay_ms}
  * `<name>_peek` answers the same question without writing (flag no-writes, so FCALL_RO and
    replicas can serve it);
  * bad arguments are answered with an error starting `RLERR` before anything is written.

Why the arithmetic looks the way it does:
  * Time is the server's TIME in integer microseconds (about 1.7e15): Lua numbers are doubles,
    exact for integers below 2^53 (9.007e15), so every quantity here is kept an integer below
    2^53, and argument bounds are chosen so that products stay below it.
  * State is kept as little-endian doubles packed with struct.pack: exact, and much cheaper
    than decimal text (sprintf and strtod are the largest costs of a call otherwise). A number
    passed to redis.call or tostring keeps only 14 significant digits, which would round a
    microsecond timestamp, so only millisecond times (13 digits) are passed as numbers, and a
    sliding log's microsecond score is written with string.format('%d').
  * Divisions go through floor_div / ceil_div, which correct the rounding of the float
    quotient, so retry_after_ms is never one millisecond short.
  * Token and leaky buckets keep their level as an exact integer count of 1/p-token units
    (see bucket()), so no fraction of a token is lost between calls.
  * Keys expire with an absolute PXAT/PEXPIREAT taken from the same TIME, at the first
    millisecond at which the state is back to its initial value: never earlier (no state is
    lost) and at most a millisecond later.
]]

local VERSION = '1.0.0'
-- The standard libraries are hidden while FUNCTION LOAD runs, and reaching a global from a
-- function goes through the library's environment (two table lookups and a metatable): bind
-- the ones used on the hot path to upvalues on the first call.
local format, find, sub, floor, fmod, min, ceil, rcall, rpcall, concat, spack, sunpack
local tonumber, type, pcall, error, unpack
local function bind()
  format, find, sub = string.format, string.find, string.sub
  floor, fmod, min, ceil = math.floor, math.fmod, math.min, math.ceil
  rcall, rpcall, concat = redis.call, redis.pcall, table.concat
  spack, sunpack = struct.pack, struct.unpack
  tonumber, type, pcall, error, unpack = _G.tonumber, _G.type, _G.pcall, _G.error, _G.unpack
end

-- 2^53: a product that reaches it may have been rounded (2^53 + 1 rounds to 2^53), so every
-- product checked against it must be strictly below.
local MAX_SAFE = 9007199254740992
local MAX_INT = 999999999999999       -- the largest limit, capacity, rate or cost (15 digits)
local MAX_DURATION_MS = 100000000000  -- 10^11 ms, a little over 3 years
local MAX_LOG = 100000                -- a sliding log keeps one entry per admitted unit
local ZADD_BATCH = 1000               -- members per ZADD: unpack() is limited by the C stack

-- Validation errors are raised as {rlerr = message} and turned into RLERR replies by
-- guarded(); any other error is a bug and propagates unchanged.
local function rlerr(msg)
  error({rlerr = msg}, 0)
end

local function guarded(fn)
  return function(keys, args)
    if not floor then
      bind()
    end
    local ok, res = pcall(fn, keys, args)
    if ok then
      return res
    end
    if type(res) == 'table' and res.rlerr then
      return redis.error_reply('RLERR ' .. res.rlerr)
    end
    error(res, 0)
  end
end

local function shown(s)
  if #s > 32 then
    s = sub(s, 1, 32) .. '...'
  end
  return "'" .. s .. "'"
end

local function check_shape(name, keys, args, names)
  if #keys ~= 1 then
    rlerr(format('%s takes exactly 1 key, got %d', name, #keys))
  end
  if #args ~= #names then
    rlerr(format('%s takes %d arguments (%s), got %d', name, #names, concat(names, ' '), #args))
  end
end

-- uint parses a decimal integer in [lo, hi]: digits only, so '-1', '+1', '1.5', '1e3', '0x10'
-- and ' 1' are all refused, and at most 15 digits, so the value is exact.
-- parsed remembers the values of the valid argument strings seen lately (strings are interned,
-- so the lookup hashes nothing): callers repeat the same limits call after call.
local parsed, nparsed = {}, 0
local function uint(args, i, name, lo, hi)
  local s = args[i]
  local n = parsed[s]
  if n and n >= lo and n <= hi then
    return n
  end
  if not find(s, '^%d+$') or #s > 15 then
    rlerr(format('%s must be an integer from %d to %d, got %s', name, lo, hi, shown(s)))
  end
  n = s + 0
  if n < lo or n > hi then
    rlerr(format('%s must be an integer from %d to %d, got %s', name, lo, hi, shown(s)))
  end
  if nparsed >= 256 then
    parsed, nparsed = {}, 0
  end
  parsed[s], nparsed = n, nparsed + 1
  return n
end

-- floor_div and ceil_div divide non-negative integers below 2^53 exactly: the float quotient
-- may be rounded up or down by one, which is corrected with exact products.
local function floor_div(a, b)
  local q = floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

local function ceil_div(a, b)
  if b == 1 then
    return a
  end
  local q = floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  if q * b < a then
    q = q + 1
  end
  return q
end

local function gcd(a, b)
  while b ~= 0 do
    a, b = b, fmod(a, b)
  end
  return a
end

-- to_ms is ceil_div(us, 1000) written out: a Lua call costs about 400 instructions and this
-- runs on every decision.
local function to_ms(us)
  if us <= 0 then
    return 0
  end
  local q = floor(us / 1000)
  if q * 1000 > us then
    q = q - 1
  elseif (q + 1) * 1000 <= us then
    q = q + 1
  end
  if q * 1000 < us then
    q = q + 1
  end
  return q
end

local function now_us()
  local t = rcall('TIME')
  return t[1] * 1000000 + t[2]
end

-- wrongtype reports the error of the first command on a limiter's key (redis.pcall returns
-- it as a table), a key of another type, as RLERR rather than as a runtime error. Callers
-- test for the table inline: a helper wrapping the call itself costs a Lua call and a vararg
-- on every decision.
local function wrongtype(name, key, res)
  rlerr(format('%s: key %s: %s', name, shown(key), res.err))
end

-- read_state returns the fields of a state packed as `format` (size bytes), or nil when the key
-- does not exist.
local function read_state(name, key, layout, size)
  local v = rpcall('GET', key)
  if type(v) == 'table' then
    wrongtype(name, key, v)
  end
  if not v then
    return nil
  end
  if #v ~= size then
    rlerr(format('%s: key %s does not hold %s state', name, shown(key), name))
  end
  return sunpack(layout, v)
end

local function reply(allowed, limit, remaining, retry_ms, reset_ms, delay_ms)
  if remaining < 0 then
    remaining = 0
  end
  return {allowed and 1 or 0, limit, remaining, retry_ms, reset_ms, delay_ms}
end

--[[
rl_fixed_window / rl_fixed_window_peek
  KEYS[1] -> state: string struct.pack('<dd', window_start_ms, count), expiring when its
             window ends
  ARGV[1] -> limit      units per window, 1..10^15-1
  ARGV[2] -> window_ms  window length; windows are aligned to the Unix epoch
  ARGV[3] -> cost       units this call takes, 0..10^15-1
  Returns the six-integer reply. At most `limit` units per aligned window: a client may use
  `limit` at the end of one window and `limit` again at the start of the next.
]]
local FIXED_ARGS = {'limit', 'window_ms', 'cost'}

local function fixed_window(name, keys, args, write)
  check_shape(name, keys, args, FIXED_ARGS)
  local limit = uint(args, 1, 'limit', 1, MAX_INT)
  local window = uint(args, 2, 'window_ms', 1, MAX_DURATION_MS)
  local cost = uint(args, 3, 'cost', 0, MAX_INT)
  local key = keys[1]

  local now = now_us()
  local now_ms = floor(now / 1000)
  local start = now_ms - fmod(now_ms, window)
  local reset_ms = to_ms((start + window) * 1000 - now)

  local count = 0
  local s, c = read_state(name, key, '<dd', 16)
  if s == start then
    count = c
  end

  if cost > limit then
    return reply(false, limit, limit - count, -1, count > 0 and reset_ms or 0, 0)
  end
  if count + cost > limit then
    -- the next window starts empty and cost <= limit, so it admits this cost
    return reply(false, limit, limit - count, reset_ms, reset_ms, 0)
  end
  if write and cost > 0 then
    count = count + cost
    rcall('SET', key, spack('<dd', start, count), 'PXAT', start + window)
    return reply(true, limit, limit - count, 0, reset_ms, 0)
  end
  return reply(true, limit, limit - count, 0, count > 0 and reset_ms or 0, 0)
end

--[[
rl_sliding_window / rl_sliding_window_peek
  KEYS[1] -> state: string struct.pack('<ddd', current_window_start_ms, previous_count,
             current_count), expiring when the current window stops counting
  ARGV[1] -> limit      1..10^15-1, and limit * window_ms must be below 2^53
  ARGV[2] -> window_ms  window length; windows are aligned to the Unix epoch
  ARGV[3] -> cost       0..10^15-1
  Returns the six-integer reply. Admits while
    previous * (window - elapsed) / window + current + cost <= limit
  with `elapsed` the whole milliseconds since the current window started: the sliding window
  counter estimate, computed exactly in integers (everything is multiplied by window_ms).
]]
-- whole_units turns units * ms of room into whole units
local function whole_units(room, window)
  if room <= 0 then
    return 0
  end
  return floor_div(room, window)
end

local function sliding_window(name, keys, args, write)
  check_shape(name, keys, args, FIXED_ARGS)
  local limit = uint(args, 1, 'limit', 1, MAX_INT)
  local window = uint(args, 2, 'window_ms', 1, MAX_DURATION_MS)
  local cost = uint(args, 3, 'cost', 0, MAX_INT)
  if limit * window >= MAX_SAFE then
    rlerr(format('limit * window_ms must be below 2^53, got %d * %d', limit, window))
  end
  local key = keys[1]

  local now = now_us()
  local now_ms = floor(now / 1000)
  local start = now_ms - fmod(now_ms, window)
  local elapsed = now_ms - start

  local prev, curr = 0, 0
  local s, p, c = read_state(name, key, '<ddd', 24)
  if s == start then
    prev, curr = p, c
  elseif s == start - window then
    prev = c
  end

  -- room: what is left of limit, in units * ms; negative if the limit was lowered
  local room = limit * window - prev * (window - elapsed) - curr * window
  -- the wait until the counts stop weighing: the current one counts until two windows on
  local reset = 0
  if curr > 0 then
    reset = start + 2 * window - now_ms
  elseif prev > 0 then
    reset = start + window - now_ms
  end

  if cost > limit then
    return reply(false, limit, whole_units(room, window), -1, reset, 0)
  end
  if cost * window > room then
    -- In this window the previous count's weight falls each millisecond; the first elapsed
    -- value e that admits satisfies prev * (window - e) <= limit*window - (curr+cost)*window.
    local target
    local left = (limit - curr - cost) * window
    if left >= 0 and prev > 0 then
      local e = window - floor_div(left, prev)
      if e < window then
        target = start + e
      end
    end
    if not target then
      -- In the next window the current count becomes the previous one.
      local e = 0
      if curr > 0 then
        e = window - floor_div((limit - cost) * window, curr)
        if e < 0 then
          e = 0
        end
      end
      target = start + window + e
    end
    return reply(false, limit, whole_units(room, window), target - now_ms, reset, 0)
  end
  if write and cost > 0 then
    rcall('SET', key, spack('<ddd', start, prev, curr + cost), 'PXAT', start + 2 * window)
    return reply(true, limit, whole_units(room - cost * window, window), 0, start + 2 * window - now_ms, 0)
  end
  return reply(true, limit, whole_units(room, window), 0, reset, 0)
end

--[[
rl_sliding_log / rl_sliding_log_peek
  KEYS[1] -> state: sorted set, one member struct.pack('<dd', time_us, n) per admitted unit,
             scored by its time in microseconds; expires when its newest entry leaves the
             window
  ARGV[1] -> limit      1..100000 (the log holds up to `limit` entries)
  ARGV[2] -> window_ms  the span
  ARGV[3] -> cost       0..10^15-1
  Returns the six-integer reply. Exact: at most `limit` units were admitted in any span of
  window_ms; an entry admitted at t counts until t + window_ms.
]]
local function sliding_log(name, keys, args, write)
  check_shape(name, keys, args, FIXED_ARGS)
  local limit = uint(args, 1, 'limit', 1, MAX_LOG)
  local window = uint(args, 2, 'window_ms', 1, MAX_DURATION_MS)
  local cost = uint(args, 3, 'cost', 0, MAX_INT)
  local key = keys[1]

  local now = now_us()
  local span = window * 1000
  local cutoff = now - span          -- entries at or before cutoff have left the window
  local cut = format('%d', cutoff)
  local after = '(' .. cut

  local count
  if write then
    local res = rpcall('ZREMRANGEBYSCORE', key, '-inf', cut)
    if type(res) == 'table' then
      wrongtype(name, key, res)
    end
    count = rcall('ZCARD', key) -- the key is a sorted set or absent now
  else
    count = rpcall('ZCOUNT', key, after, '+inf')
    if type(count) == 'table' then
      wrongtype(name, key, count)
    end
  end

  local function reset_ms()
    local newest = rcall('ZRANGE', key, '+inf', after, 'BYSCORE', 'REV', 'LIMIT', 0, 1, 'WITHSCORES')
    if #newest == 0 then
      return 0
    end
    return to_ms(tonumber(newest[2]) + span - now)
  end

  if cost > limit then
    return reply(false, limit, limit - count, -1, reset_ms(), 0)
  end
  if count + cost > limit then
    -- the (count + cost - limit)-th oldest entry must leave the window first
    local k = count + cost - limit
    local e = rcall('ZRANGE', key, after, '+inf', 'BYSCORE', 'LIMIT', k - 1, 1, 'WITHSCORES')
    return reply(false, limit, limit - count, to_ms(tonumber(e[2]) + span - now), reset_ms(), 0)
  end
  if write and cost > 0 then
    -- members are unique per unit: same-microsecond calls see a larger count
    local score = format('%d', now)
    local i = 1
    while i <= cost do
      local batch = {}
      local last = min(cost, i + ZADD_BATCH - 1)
      for j = i, last do
        batch[#batch + 1] = score
        batch[#batch + 1] = spack('<dd', now, count + j)
      end
      rcall('ZADD', key, unpack(batch))
      i = last + 1
    end
    rcall('PEXPIREAT', key, ceil_div(now + span, 1000))
    return reply(true, limit, limit - count - cost, 0, window, 0)
  end
  return reply(true, limit, limit - count, 0, reset_ms(), 0)
end

--[[
The token bucket and the leaky bucket share one exact core.

With period_us = period_ms * 1000 and g = gcd(rate, period_us), one unit of cost is p =
period_us / g "ticks" and the bucket drains r = rate / g ticks per microsecond, so `rate`
units per period is exact in integers. `debt` is the number of ticks the bucket holds: for a
token bucket, the tokens missing from a full bucket; for a leaky bucket, its level. A bucket
of `capacity` holds at most capacity * p ticks, which must be below 2^53.

State: string struct.pack('<ddd', time_us, debt, p); p is stored so that a change of rate or
period keeps the level in units (rounded up) rather than misreading it.
]]
local BUCKET_ARGS = {'capacity', 'rate', 'period_ms', 'cost'}
local LEAKY_ARGS = {'capacity', 'rate', 'period_ms', 'cost', 'mode'}

local last_rate, last_period, last_g
local function bucket(name, key, capacity, rate, period, cost, write, shape)
  local period_us = period * 1000
  local g = last_g
  if rate ~= last_rate or period_us ~= last_period then
    g = gcd(rate, period_us)
    last_rate, last_period, last_g = rate, period_us, g
  end
  local r, p = rate / g, period_us / g
  local full = capacity * p
  if full >= MAX_SAFE then
    rlerr(format('capacity * period_ms * 1000 / gcd(rate, period_ms * 1000) must be below 2^53, got %d * %d / %d', capacity, period_us, g))
  end

  local now = now_us()
  local debt = 0
  local ts, d, sp = read_state(name, key, '<ddd', 24)
  if ts then
    if sp ~= p then
      d = ceil(d * p / sp)
    end
    if d > full then
      d = full
    end
    local drained = (now - ts) * r
    if drained >= d then
      d = 0
    elseif drained > 0 then
      d = d - drained
    end
    debt = d
  end

  if cost > capacity then
    return reply(false, capacity, floor_div(full - debt, p), -1, to_ms(ceil_div(debt, r)), 0)
  end
  local need = cost * p
  if debt + need > full then
    return reply(false, capacity, floor_div(full - debt, p), to_ms(ceil_div(debt + need - full, r)), to_ms(ceil_div(debt, r)), 0)
  end
  -- shaping: this call leaves once the level ahead of it has drained
  -- r is 1 whenever rate divides period_us (100 per second, 60 per minute...): skip the
  -- division calls then, this path runs on every admitted call
  local reset
  local delay = 0
  if shape then
    delay = to_ms(r == 1 and debt or ceil_div(debt, r))
    reset = delay
  end
  if write and cost > 0 then
    debt = debt + need
    local empty_us = r == 1 and debt or ceil_div(debt, r)
    rcall('SET', key, spack('<ddd', now, debt, p), 'PXAT', ceil_div(now + empty_us, 1000))
    reset = to_ms(empty_us)
  elseif not reset then
    reset = to_ms(ceil_div(debt, r))
  end
  -- the reply written out (debt <= full, so nothing to clamp): the common path saves a call
  return {1, capacity, floor_div(full - debt, p), 0, reset, delay}
end

--[[
rl_token_bucket / rl_token_bucket_peek
  KEYS[1] -> state (see bucket above); absent means a full bucket
  ARGV[1] -> capacity   tokens a full bucket holds, the largest burst, 1..10^15-1
  ARGV[2] -> rate       tokens added per period, continuously, 1..10^15-1
  ARGV[3] -> period_ms  1..10^11
  ARGV[4] -> cost       tokens this call takes, 0..10^15-1
  Returns the six-integer reply; reset_after_ms is the time until the bucket is full again.
]]
local function token_bucket(name, keys, args, write)
  check_shape(name, keys, args, BUCKET_ARGS)
  local capacity = uint(args, 1, 'capacity', 1, MAX_INT)
  local rate = uint(args, 2, 'rate', 1, MAX_INT)
  local period = uint(args, 3, 'period_ms', 1, MAX_DURATION_MS)
  local cost = uint(args, 4, 'cost', 0, MAX_INT)
  return bucket(name, keys[1], capacity, rate, period, cost, write, false)
end

--[[
rl_leaky_bucket / rl_leaky_bucket_peek
  KEYS[1] -> state (see bucket above); absent means an empty bucket
  ARGV[1] -> capacity   units the bucket (the queue) holds, 1..10^15-1
  ARGV[2] -> rate       units leaking out per period, 1..10^15-1
  ARGV[3] -> period_ms  1..10^11
  ARGV[4] -> cost       units this call adds, 0..10^15-1
  ARGV[5] -> mode       'police': admit now or reject the overflow;
                        'shape': admit with delay_ms (the time for the units ahead of it to
                        leak out), so admitted calls leave spaced by period_ms / rate; reject
                        when the queue is full.
  Returns the six-integer reply; reset_after_ms is the time until the bucket is empty.
]]
local function leaky_bucket(name, keys, args, write)
  check_shape(name, keys, args, LEAKY_ARGS)
  local capacity = uint(args, 1, 'capacity', 1, MAX_INT)
  local rate = uint(args, 2, 'rate', 1, MAX_INT)
  local period = uint(args, 3, 'period_ms', 1, MAX_DURATION_MS)
  local cost = uint(args, 4, 'cost', 0, MAX_INT)
  local mode = args[5]
  if mode ~= 'police' and mode ~= 'shape' then
    rlerr(format("mode must be 'police' or 'shape', got %s", shown(mode)))
  end
  return bucket(name, keys[1], capacity, rate, period, cost, write, mode == 'shape')
end

--[[
rl_version
  no keys, no arguments -> the library's semantic version, e.g. '1.0.0'
]]
local function version(keys, args)
  if #keys ~= 0 or #args ~= 0 then
    rlerr('rl_version takes no keys and no arguments')
  end
  return VERSION
end

local function register(name, limiter)
  redis.register_function{
    function_name = name,
    callback = guarded(function(keys, args) return limiter(name, keys, args, true) end),
  }
  local peek = name .. '_peek'
  redis.register_function{
    function_name = peek,
    callback = guarded(function(keys, args) return limiter(peek, keys, args, false) end),
    flags = {'no-writes'},
  }
end

register('rl_fixed_window', fixed_window)
register('rl_sliding_log', sliding_log)
register('rl_sliding_window', sliding_window)
register('rl_token_bucket', token_bucket)
register('rl_leaky_bucket', leaky_bucket)

redis.register_function{
  function_name = 'rl_version',
  callback = guarded(version),
  flags = {'no-writes', 'allow-stale'},
}
