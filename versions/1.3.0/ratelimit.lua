#!lua name=ratelimit
--[[
ratelimit: rate-limiting algorithms as one Valkey / Redis Functions library (five textbook
algorithms and calendar quotas), with the production patterns around them (reserve, refunds,
concurrency leases, blocks, several limits in one decision, holds that expire).

Release 1.3.0. Contract (major version 1; the full text, every release's, is docs/library.md):
  * every function but rl_multi, rl_hold and rl_hold_settle takes exactly one key, KEYS[1],
    which holds all of its state (a hold is a limiter's key and its hold key);
  * ARGV numbers are decimal integers, durations are milliseconds, rates are `rate` units per
    `period_ms`, times (a calendar's boundaries) are Unix milliseconds;
  * every limiter, peek, refund, lease and block function replies with six integers:
      {allowed, limit, remaining, retry_after_ms, reset_after_ms, delay_ms}
    (rl_multi adds a seventh: the 1-based index of the binding limit);
  * `<name>_peek` answers the same question without writing (flag no-writes, so FCALL_RO and
    replicas can serve it);
  * bad arguments, and keys that hold anything but the called function's own state, are
    answered with an error starting `RLERR <function>` before anything is written;
  * "now" is the server's TIME; a key never outlives its reset_after_ms by more than 1000 ms
    nor expires before it, and a call that leaves its key in the initial state deletes it;
  * within major version 1, names, ARGV and replies only grow, and every state format stays as
    released: a deploy, or a rollback to an earlier 1.x, keeps every live limiter.

Each algorithm is one descriptor (see ALGORITHMS below): how to parse its arguments, how to
decide, how to refund. The limiter, its peek, its refund and its rl_multi group are all made
from it by register(), which refuses to load a descriptor that lacks a piece.

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
    (see bucket_decide), so no fraction of a token is lost between calls.
  * Keys expire with an absolute PXAT/PEXPIREAT taken from the same TIME, at the first
    millisecond at which the state is back to its initial value: never earlier (no state is
    lost) and at most a millisecond later. A call that leaves a limiter in its initial state
    deletes its key.

State formats are those of 1.0.0, unchanged (a rollback to 1.0.0 keeps every live limiter);
concurrency leases (1.1.0), blocks (1.2.0) and hold keys (1.3.0) are the only new state, and a
calendar key holds a fixed window's.

Portable: what a newer Lua engine may lack (struct, the global unpack) is bound with a fallback
in bind(), and every number is an integer below 2^53, so the results do not depend on whether
the engine has a separate integer type.
]]

local VERSION = '1.3.0'
-- The standard libraries are hidden while FUNCTION LOAD runs, and reaching a global from a
-- function goes through the library's environment (two table lookups and a metatable): bind
-- the ones used on the hot path to upvalues on the first call.
local format, find, sub, floor, fmod, min, ceil, rcall, rpcall, concat, spack, sunpack
local tonumber, type, pcall, error, unpack
-- A newer Lua engine may lack what Lua 5.1 has (struct, the global unpack): each is looked up
-- through pcall, since reading an absent global can raise in a server's sandbox, and falls back
-- on its Lua 5.3 name (string.pack and string.unpack read the same '<d...' formats).
local function global(name)
  local ok, v = _G.pcall(function() return _G[name] end)
  if ok then
    return v
  end
  return nil
end

local function bind()
  format, find, sub = string.format, string.find, string.sub
  floor, fmod, min, ceil = math.floor, math.fmod, math.min, math.ceil
  rcall, rpcall, concat = redis.call, redis.pcall, table.concat
  local st = global('struct')
  if st then
    spack, sunpack = st.pack, st.unpack
  else
    spack, sunpack = string.pack, string.unpack
  end
  tonumber, type, pcall, error = _G.tonumber, _G.type, _G.pcall, _G.error
  unpack = global('unpack') or table.unpack
end

-- 2^53: a product that reaches it may have been rounded (2^53 + 1 rounds to 2^53), so every
-- product checked against it must be strictly below.
local MAX_SAFE = 9007199254740992
local MAX_INT = 999999999999999       -- the largest limit, capacity, rate or cost (15 digits)
local MAX_DURATION_MS = 100000000000  -- 10^11 ms, a little over 3 years
local MAX_LOG = 100000                -- a sliding log keeps one entry per admitted unit
local MAX_ID = 128                    -- a lease holder's id, in bytes
local MAX_MULTI = 16                  -- keys in one rl_multi
local ZADD_BATCH = 1000               -- members per ZADD: unpack() is limited by the C stack
local INF = 1 / 0
-- Every timestamp the library writes is the server's TIME: in microseconds it is above 10^14
-- (1973) and in milliseconds below it (year 5138). That tells a bucket's state (microseconds)
-- from a sliding window's (milliseconds), which have the same size. Every number a state holds
-- is an integer, and x % 1 == 0 is false for a fraction, NaN and an infinity alike.
local US_FLOOR = 1e14

-- Validation errors are raised as {rlerr = message} and turned into RLERR replies by
-- guarded(); any other error is a bug and propagates unchanged.
local function rlerr(msg)
  error({rlerr = msg}, 0)
end

-- group_i, group_alg and group_fn say which rl_multi group is being parsed, so that an RLERR
-- raised by its parse names it; set without a pcall per group, cleared after parsing and by
-- any error.
local group_i, group_alg, group_fn

-- guarded turns the RLERR of a call to the function `name` into its error reply. A message
-- that does not start with the function's name (a bad value, found by a helper that does not
-- know which function parses it) is prefixed with it, so that every RLERR names its function.
local function guarded(name, fn)
  return function(keys, args)
    if not floor then
      bind()
    end
    local ok, res = pcall(fn, keys, args)
    if ok then
      return res
    end
    local i = group_i
    group_i = nil
    if type(res) == 'table' and res.rlerr then
      if i then
        return redis.error_reply(format('RLERR %s: group %d (%s): %s', group_fn, i, group_alg, res.rlerr))
      end
      local msg = res.rlerr
      local head = sub(msg, 1, #name + 1)
      if head ~= name .. ':' and head ~= name .. ' ' then
        msg = name .. ': ' .. msg
      end
      return redis.error_reply('RLERR ' .. msg)
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
-- may be rounded up or down by one, which is corrected with exact products. Hot callers
-- inline the b == 1 case, so these do not test it.
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

local function foreign(name, key, algorithm)
  rlerr(format('%s: key %s does not hold %s state', name, shown(key), algorithm))
end

-- read_state returns the fields of a state packed as `layout` (size bytes), or nil when the
-- key does not exist; a string of another size is refused.
local function read_state(name, key, layout, size, algorithm)
  local v = rpcall('GET', key)
  if type(v) == 'table' then
    wrongtype(name, key, v)
  end
  if not v then
    return nil
  end
  if #v ~= size then
    foreign(name, key, algorithm)
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
Every algorithm is a descriptor:
  name     its name in rl_multi groups and in its functions' names (rl_<name>...)
  args     its limiter's ARGV names, without the optional trailing `reserve`
  parse(args, o) -> cost, limit, a, b, c
           validates args[o+1 .. o+#args] and returns the cost, then the limit (or capacity)
           and the algorithm's other parameters (up to three: rl_multi keeps three per
           group)
  decide(name, key, now, emit, cost, reserve, limit, a, b, c) -> reply
           judges cost + reserve against the state at `now` (microseconds) and consumes cost
           when admitted. emit is how it writes: redis.call for a limiter call, nil for a peek
           (nothing is written), or rl_multi's collector, which runs the writes only if every
           limit admits.
  refund(name, key, now, n, limit, a, b, c) -> reply
           gives back n units, as far as the state still holds them.
]]

-- REFUND, passed to a decide function as emit, makes it give `cost` units back instead of
-- deciding: the state is read by the same code, and the hot path pays no function call for it.
local REFUND = {}

-- refund_via makes a descriptor's refund from its decide.
local function refund_via(decide)
  return function(name, key, now, n, limit, a, b, c)
    return decide(name, key, now, REFUND, n, 0, limit, a, b, c)
  end
end

--[[
fixed_window
  KEYS[1] -> state: string struct.pack('<dd', window_start_ms, count), expiring when its
             window ends
  ARGV    -> limit      units per window, 1..10^15-1
             window_ms  window length; windows are aligned to the Unix epoch
             cost       units this call takes, 0..10^15-1
             [reserve]  0..limit units that must be left after this call (default 0)
  At most `limit` units per aligned window: a client may use `limit` at the end of one window
  and `limit` again at the start of the next.
]]
local WINDOW_ARGS = {'limit', 'window_ms', 'cost'}

-- window_parser makes the parse of a windowed limiter: limit (1..max_limit), window_ms, cost,
-- and with `product`, limit * window_ms below 2^53. The cached values are looked up inline: a
-- call per argument is the largest cost of parsing.
local function window_parser(max_limit, product)
  return function(args, o)
    local cost, limit, window = parsed[args[o + 3]], parsed[args[o + 1]], parsed[args[o + 2]]
    if not (cost and limit and window and limit >= 1 and limit <= max_limit and window >= 1 and window <= MAX_DURATION_MS) then
      cost, limit = uint(args, o + 3, 'cost', 0, MAX_INT), uint(args, o + 1, 'limit', 1, max_limit)
      window = uint(args, o + 2, 'window_ms', 1, MAX_DURATION_MS)
    end
    if product and limit * window >= MAX_SAFE then
      rlerr(format('limit * window_ms must be below 2^53, got %d * %d', limit, window))
    end
    return cost, limit, window
  end
end

-- fixed_decide decides for a fixed window; with emit REFUND it gives `cost` units back.
local function fixed_decide(name, key, now, emit, cost, reserve, limit, window)
  local now_ms = floor(now / 1000)
  local start = now_ms - fmod(now_ms, window)
  local reset_ms = to_ms((start + window) * 1000 - now)
  local count = 0
  local s, c = read_state(name, key, '<dd', 16, 'fixed_window')
  if s then
    -- A count is a whole number (x % 1 is NaN for an infinity or NaN), a window start a whole
    -- millisecond before 10^14: the current window's start is one, so the hot path only
    -- checks the count.
    if s == start then
      if not (c >= 0 and c % 1 == 0) then
        foreign(name, key, 'fixed_window')
      end
      count = c
    elseif not (c >= 0 and c % 1 == 0 and s >= 0 and s < US_FLOOR and s % 1 == 0) then
      foreign(name, key, 'fixed_window')
    end
  end

  if emit == REFUND then
    if not s then
      return {1, limit, limit, 0, 0, 0}
    end
    count = count - cost
    if count <= 0 then
      rcall('DEL', key)
      return {1, limit, limit, 0, 0, 0}
    end
    if cost > 0 then
      rcall('SET', key, spack('<dd', start, count), 'PXAT', start + window)
    end
    return reply(true, limit, limit - count, 0, reset_ms, 0)
  end
  local need = cost + reserve
  if need > limit or count + need > limit then
    if emit and s and count == 0 then
      emit('DEL', key) -- a window that has ended: the initial state
    end
    -- the next window starts empty, so it admits any need <= limit
    return reply(false, limit, limit - count - reserve, need > limit and -1 or reset_ms,
      count > 0 and reset_ms or 0, 0)
  end
  if emit and cost > 0 then
    count = count + cost
    emit('SET', key, spack('<dd', start, count), 'PXAT', start + window)
    -- the reply written out: the write path runs on most calls
    local remaining = limit - count - reserve
    return {1, limit, remaining > 0 and remaining or 0, 0, reset_ms, 0}
  end
  if emit and s and count == 0 then
    emit('DEL', key)
  end
  return reply(true, limit, limit - count - reserve, 0, count > 0 and reset_ms or 0, 0)
end

-- window_horizon is how long a fixed or sliding window can give back units taken now: until
-- the current window ends (see holds below).
local function window_horizon(now_ms, r, limit, window)
  return now_ms - fmod(now_ms, window) + window
end

local fixed_window = {
  name = 'fixed_window',
  args = WINDOW_ARGS,
  parse = window_parser(MAX_INT, false),
  decide = fixed_decide,
  refund = refund_via(fixed_decide),
  horizon = window_horizon,
}

--[[
sliding_window
  KEYS[1] -> state: string struct.pack('<ddd', current_window_start_ms, previous_count,
             current_count), expiring when the current window stops counting
  ARGV    -> limit      1..10^15-1, and limit * window_ms must be below 2^53
             window_ms  window length; windows are aligned to the Unix epoch
             cost       0..10^15-1
             [reserve]  0..limit
  Admits while
    previous * (window - elapsed) / window + current + cost + reserve <= limit
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

-- sliding_decide decides for a sliding window; with emit REFUND it gives `cost` units back.
local function sliding_decide(name, key, now, emit, cost, reserve, limit, window)
  local now_ms = floor(now / 1000)
  local start = now_ms - fmod(now_ms, window)
  local elapsed = now_ms - start
  local prev, curr = 0, 0
  local s, p, c = read_state(name, key, '<ddd', 24, 'sliding_window')
  if s then
    -- Counts are whole numbers (x % 1 is NaN for an infinity or NaN), a window start a whole
    -- millisecond before 10^14 (a bucket's time is in microseconds): the current and previous
    -- windows' starts are, so the hot path only checks the counts.
    if not (p >= 0 and c >= 0 and p % 1 == 0 and c % 1 == 0) then
      foreign(name, key, 'sliding_window')
    end
    if s == start then
      prev, curr = p, c
    elseif s == start - window then
      prev = c
    elseif not (s >= 0 and s < US_FLOOR and s % 1 == 0) then
      foreign(name, key, 'sliding_window')
    end
    if emit and prev == 0 and curr == 0 then
      -- windows that stopped counting: the initial state
      if emit == REFUND then
        rcall('DEL', key)
      else
        emit('DEL', key)
      end
    end
  end
  if emit == REFUND then
    -- units counted in the previous window stay: the state no longer tells them apart
    if curr > 0 and cost > 0 then
      curr = curr - cost
      if curr < 0 then
        curr = 0
      end
      if curr > 0 then
        rcall('SET', key, spack('<ddd', start, prev, curr), 'PXAT', start + 2 * window)
      elseif prev > 0 then
        rcall('SET', key, spack('<ddd', start, prev, 0), 'PXAT', start + window)
      else
        rcall('DEL', key)
      end
    end
    cost, reserve, emit = 0, 0, nil -- the limiter after the refund, as a peek describes it
  end

  -- room: what is left of limit, in units * ms; negative if the limit was lowered
  local room = limit * window - prev * (window - elapsed) - curr * window
  -- the wait until the counts stop weighing: the current one counts until two windows on,
  -- the previous one until the current window ends
  local reset = 0
  if curr > 0 then
    reset = start + 2 * window - now_ms
  elseif prev > 0 then
    reset = start + window - now_ms
  end
  local need = cost + reserve
  local kept = reserve * window

  if need > limit then
    return reply(false, limit, whole_units(room - kept, window), -1, reset, 0)
  end
  if need * window > room then
    -- In this window the previous count's weight falls each millisecond; the first elapsed
    -- value e that admits satisfies prev * (window - e) <= limit*window - (curr+need)*window.
    local target
    local left = (limit - curr - need) * window
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
        e = window - floor_div((limit - need) * window, curr)
        if e < 0 then
          e = 0
        end
      end
      target = start + window + e
    end
    return reply(false, limit, whole_units(room - kept, window), target - now_ms, reset, 0)
  end
  if emit and cost > 0 then
    emit('SET', key, spack('<ddd', start, prev, curr + cost), 'PXAT', start + 2 * window)
    return {1, limit, whole_units(room - cost * window - kept, window), 0, start + 2 * window - now_ms, 0}
  end
  return reply(true, limit, whole_units(room - kept, window), 0, reset, 0)
end

local sliding_window = {
  name = 'sliding_window',
  args = WINDOW_ARGS,
  parse = window_parser(MAX_INT, true),
  decide = sliding_decide,
  refund = refund_via(sliding_decide),
  horizon = window_horizon,
}

--[[
sliding_log
  KEYS[1] -> state: sorted set, one member struct.pack('<dd', time_us, n) per admitted unit,
             scored by its time in microseconds; expires when its newest entry leaves the
             window
  ARGV    -> limit      1..100000 (the log holds up to `limit` entries)
             window_ms  the span
             cost       0..10^15-1
             [reserve]  0..limit
  Exact: at most `limit` units were admitted in any span of window_ms; an entry admitted at t
  counts until t + window_ms.
]]

-- log_oldest reads the log's oldest entry: nil when the key does not exist, else its time in
-- microseconds. Every call reads it first: it tells a log from another sorted set (a
-- concurrency key's oldest member is its empty marker) before anything is written, and when it
-- is still in the window nothing has expired, so nothing needs removing. Only the member is
-- read (a 16-byte time from 10^14 and a count from 1, both whole): a score costs a double
-- formatted by the server and parsed back, 10% of a call on Redis 7.0. The member's time is its
-- score (see ZADD below).
local function log_oldest(name, key)
  local e = rpcall('ZRANGE', key, 0, 0)
  if e.err then
    wrongtype(name, key, e)
  end
  local m = e[1]
  if not m then
    return nil
  end
  local t, n
  if #m == 16 then
    t, n = sunpack('<dd', m)
  end
  if not (t and t >= US_FLOOR and n >= 1 and t % 1 == 0 and n % 1 == 0) then
    foreign(name, key, 'sliding_log')
  end
  return t
end

-- log_reset is the wait until the newest entry leaves the window.
local function log_reset(key, span, now)
  local newest = rcall('ZRANGE', key, -1, -1, 'WITHSCORES')
  if #newest == 0 then
    return 0
  end
  return to_ms(tonumber(newest[2]) + span - now)
end

local sliding_log = {
  name = 'sliding_log',
  args = WINDOW_ARGS,
  parse = window_parser(MAX_LOG, false),
  decide = function(name, key, now, emit, cost, reserve, limit, window)
    local span = window * 1000
    local cutoff = now - span          -- entries at or before cutoff have left the window
    local oldest = log_oldest(name, key)
    local count = 0
    local after
    if oldest then
      after = '(' .. format('%d', cutoff)
      if not emit then
        count = rcall('ZCOUNT', key, after, '+inf')
      elseif oldest > cutoff then
        count = rcall('ZCARD', key)
      elseif emit == rcall then
        rcall('ZREMRANGEBYSCORE', key, '-inf', format('%d', cutoff))
        count = rcall('ZCARD', key) -- 0 when every entry expired: the key is gone
      else
        -- rl_multi writes nothing before every limit is judged: the cleanup waits with the
        -- other writes
        count = rcall('ZCOUNT', key, after, '+inf')
        emit('ZREMRANGEBYSCORE', key, '-inf', format('%d', cutoff))
      end
    end
    local need = cost + reserve

    if need > limit then
      return reply(false, limit, limit - count - reserve, -1, count > 0 and log_reset(key, span, now) or 0, 0)
    end
    if count + need > limit then
      -- the (count + need - limit)-th oldest entry must leave the window first
      local k = count + need - limit
      local e = rcall('ZRANGE', key, after, '+inf', 'BYSCORE', 'LIMIT', k - 1, 1, 'WITHSCORES')
      return reply(false, limit, limit - count - reserve, to_ms(tonumber(e[2]) + span - now), log_reset(key, span, now), 0)
    end
    if emit and cost > 0 then
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
        emit('ZADD', key, unpack(batch))
        i = last + 1
      end
      emit('PEXPIREAT', key, ceil_div(now + span, 1000))
      local remaining = limit - count - cost - reserve
      return {1, limit, remaining > 0 and remaining or 0, 0, window, 0}
    end
    return reply(true, limit, limit - count - reserve, 0, count > 0 and log_reset(key, span, now) or 0, 0)
  end,
  refund = function(name, key, now, n, limit, window)
    local span = window * 1000
    local cutoff = now - span
    local oldest = log_oldest(name, key)
    if not oldest then
      return {1, limit, limit, 0, 0, 0}
    end
    if oldest <= cutoff then
      rcall('ZREMRANGEBYSCORE', key, '-inf', format('%d', cutoff))
    end
    local count = rcall('ZCARD', key)
    local take = min(n, count)
    if take > 0 then
      -- the newest entries: the most recent admissions
      rcall('ZREMRANGEBYRANK', key, -take, -1)
      count = count - take
    end
    if count == 0 then
      return {1, limit, limit, 0, 0, 0} -- the emptied sorted set is gone
    end
    local newest = tonumber(rcall('ZRANGE', key, -1, -1, 'WITHSCORES')[2])
    if take > 0 then
      rcall('PEXPIREAT', key, ceil_div(newest + span, 1000))
    end
    return reply(true, limit, limit - count, 0, to_ms(newest + span - now), 0)
  end,
}

--[[
token_bucket and leaky_bucket share one exact core.

With period_us = period_ms * 1000 and g = gcd(rate, period_us), one unit of cost is p =
period_us / g "ticks" and the bucket drains r = rate / g ticks per microsecond, so `rate`
units per period is exact in integers. `debt` is the number of ticks the bucket holds: for a
token bucket, the tokens missing from a full bucket; for a leaky bucket, its level. A bucket
of `capacity` holds at most capacity * p ticks, which must be below 2^53.

State: string struct.pack('<ddd', time_us, debt, p); p is stored so that a change of rate or
period keeps the level in units (rounded up) rather than misreading it.

token_bucket
  KEYS[1] -> state; absent means a full bucket
  ARGV    -> capacity   tokens a full bucket holds, the largest burst, 1..10^15-1
             rate       tokens added per period, continuously, 1..10^15-1
             period_ms  1..10^11
             cost       tokens this call takes, 0..10^15-1
             [reserve]  0..capacity tokens that must be left after this call
  reset_after_ms is the time until the bucket is full again.

leaky_bucket
  KEYS[1] -> state; absent means an empty bucket
  ARGV    -> capacity   units the bucket (the queue) holds, 1..10^15-1
             rate       units leaking out per period, 1..10^15-1
             period_ms  1..10^11
             cost       units this call adds, 0..10^15-1
             mode       'police': admit now or reject the overflow;
                        'shape': admit with delay_ms (the time for the units ahead of it to
                        leak out), so admitted calls leave spaced by period_ms / rate; reject
                        when the queue is full.
             [reserve]  0..capacity units of the queue that must stay free after this call
  reset_after_ms is the time until the bucket is empty.
]]
local BUCKET_ARGS = {'capacity', 'rate', 'period_ms', 'cost'}
local LEAKY_ARGS = {'capacity', 'rate', 'period_ms', 'cost', 'mode'}

local last_rate, last_period, last_g

-- bucket_decide judges cost + reserve against a bucket's state (see decide above); with emit
-- REFUND it gives `cost` units back instead.
local function bucket_decide(name, key, now, emit, cost, reserve, capacity, rate, period, shape)
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
  local debt = 0
  local ts, d, sp = read_state(name, key, '<ddd', 24, shape == nil and 'token_bucket' or 'leaky_bucket')
  if ts then
    -- a time is a whole microsecond from 10^14, the debt a whole number of ticks, p one from 1
    -- (x % 1 is NaN for an infinity or NaN)
    if not (ts >= US_FLOOR and d >= 0 and sp >= 1 and ts % 1 == 0 and d % 1 == 0 and sp % 1 == 0) then
      foreign(name, key, shape == nil and 'token_bucket' or 'leaky_bucket')
    end
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
    elseif ts >= MAX_SAFE then
      -- a time no TIME reaches before the year 2255: checked only when it is not in the past,
      -- so the hot path does not pay for it
      foreign(name, key, shape == nil and 'token_bucket' or 'leaky_bucket')
    end
    debt = d
  end

  if emit == REFUND then
    if not ts then
      return {1, capacity, capacity, 0, 0, 0}
    end
    local give = cost * p -- at or above 2^53 it is above any debt, rounded or not
    if give >= debt then
      rcall('DEL', key)
      return {1, capacity, capacity, 0, 0, 0}
    end
    if give > 0 then
      debt = debt - give
      rcall('SET', key, spack('<ddd', now, debt, p), 'PXAT', ceil_div(now + ceil_div(debt, r), 1000))
    end
    return {1, capacity, floor_div(full - debt, p), 0, to_ms(ceil_div(debt, r)), 0}
  end
  if emit and ts and debt == 0 then
    emit('DEL', key) -- drained: the initial state
  end
  local need = cost + reserve
  if need > capacity then
    return reply(false, capacity, floor_div(full - debt, p) - reserve, -1, to_ms(ceil_div(debt, r)), 0)
  end
  if debt + need * p > full then
    return reply(false, capacity, floor_div(full - debt, p) - reserve, to_ms(ceil_div(debt + need * p - full, r)), to_ms(ceil_div(debt, r)), 0)
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
  if emit and cost > 0 then
    debt = debt + cost * p
    local empty_us = r == 1 and debt or ceil_div(debt, r)
    emit('SET', key, spack('<ddd', now, debt, p), 'PXAT', ceil_div(now + empty_us, 1000))
    reset = to_ms(empty_us)
  elseif not reset then
    reset = to_ms(ceil_div(debt, r))
  end
  local remaining = floor_div(full - debt, p) - reserve
  if remaining < 0 then
    remaining = 0
  end
  return {1, capacity, remaining, 0, reset, delay}
end

-- bucket_parser validates capacity rate period_ms cost (and, for a leaky bucket, mode) from
-- args[o+1]; the capacity * p bound is checked by bucket_decide, which computes p anyway. The
-- cached values are looked up inline: a call per argument is the largest cost of parsing.
local function bucket_parser(leaky)
  return function(args, o)
    local shape
    if leaky then
      local mode = args[o + 5]
      if mode ~= 'police' and mode ~= 'shape' then
        rlerr(format("mode must be 'police' or 'shape', got %s", shown(mode)))
      end
      shape = mode == 'shape'
    end
    local cost, capacity, rate, period = parsed[args[o + 4]], parsed[args[o + 1]], parsed[args[o + 2]], parsed[args[o + 3]]
    if not (cost and capacity and rate and period and capacity >= 1 and rate >= 1 and period >= 1 and period <= MAX_DURATION_MS) then
      cost, capacity = uint(args, o + 4, 'cost', 0, MAX_INT), uint(args, o + 1, 'capacity', 1, MAX_INT)
      rate, period = uint(args, o + 2, 'rate', 1, MAX_INT), uint(args, o + 3, 'period_ms', 1, MAX_DURATION_MS)
    end
    return cost, capacity, rate, period, shape
  end
end

-- bucket_horizon: a bucket gives back units until it would be full (token) or empty (leaky)
-- again with no other call, which is the reply's reset_after_ms.
local function bucket_horizon(now_ms, r)
  return now_ms + r[5]
end

local token_bucket = {
  name = 'token_bucket',
  args = BUCKET_ARGS,
  parse = bucket_parser(false), -- shape is nil: a token bucket
  decide = bucket_decide,
  refund = refund_via(bucket_decide),
  horizon = bucket_horizon,
}

local leaky_bucket = {
  name = 'leaky_bucket',
  args = LEAKY_ARGS,
  parse = bucket_parser(true),
  decide = bucket_decide,
  refund = refund_via(bucket_decide),
  horizon = bucket_horizon,
}

--[[
calendar
  KEYS[1] -> state: the fixed window's, string struct.pack('<dd', window_start_ms, count),
             window_start_ms being the b of the window decided; expires when that window ends
  ARGV    -> limit      units per window, 1..10^15-1
             b1 b2 b3 b4  Unix milliseconds, 1..10^15-1, b1 < b2 < b3 < b4: the starts of three
                        consecutive windows [b1,b2) [b2,b3) [b3,b4) and the end of the third,
                        each 1..10^11 ms long
             cost       units this call takes, 0..10^15-1
             [reserve]  0..limit units that must be left after this call (default 0)
  A fixed window whose windows the caller computes (days, weeks, months, years in a time
  zone, which no fixed length describes: Lua has no time-zone data) and the server's clock
  picks: the call decides in the window that holds now. A caller passes the window its own
  clock is in as the middle one, so hosts whose clocks are off by less than a window never
  split, double or skip one. Now outside [b1, b4) is RLERR (stale boundaries, or a clock off
  by more than a window) before anything is written. retry_after_ms and reset_after_ms run to
  the window's end.

  A key whose window_start_ms is not the current window's holds another window (ended, or
  computed from other boundaries): it counts as empty, and every call that writes replaces or
  deletes it, even a denied rl_multi (the fixed window leaves an ended window to its expiry,
  which for a calendar key computed from other boundaries may be far off).
]]
local CALENDAR_ARGS = {'limit', 'b1', 'b2', 'b3', 'b4', 'cost'}

-- calendar_bounds refuses boundaries out of order, or a window longer than 10^11 ms.
local function calendar_bounds(b1, b2, b3, b4)
  local b = {b1, b2, b3, b4}
  for i = 2, 4 do
    local len = b[i] - b[i - 1]
    if len < 1 or len > MAX_DURATION_MS then
      rlerr(format('window [b%d, b%d) must be 1 to %d ms long (b1 < b2 < b3 < b4), got %d to %d',
        i - 1, i, MAX_DURATION_MS, b[i - 1], b[i]))
    end
  end
end

-- The boundaries last validated, as strings and as parameters: the callers of one quota pass
-- the same four strings call after call (strings are interned, so comparing them compares
-- pointers), which then skip four lookups and the checks of their order and lengths.
local last_s1, last_s2, last_s3, last_s4, last_b2, last_b3, last_outer

-- parse_calendar validates limit b1 b2 b3 b4 cost from args[o+1]; the cached values are looked
-- up inline, as window_parser does. It returns cost, limit, b2, b3 and {b1, b4}: the middle
-- window, the one the caller's clock is in and so the one decided in nearly every call, as
-- numbers, and the outer boundaries in a table, so that a calendar has at most three
-- parameters, as every algorithm has: rl_multi keeps three per group, and a fourth slot in
-- every group cost a 3-limit rl_multi of 1.1 groups about 1% more instructions (callgrind).
local function parse_calendar(args, o)
  local s1, s2, s3, s4 = args[o + 2], args[o + 3], args[o + 4], args[o + 5]
  local b2, b3, outer
  if s4 == last_s4 and s3 == last_s3 and s2 == last_s2 and s1 == last_s1 then
    b2, b3, outer = last_b2, last_b3, last_outer
  else
    local b1, b4
    b1, b2 = uint(args, o + 2, 'b1', 1, MAX_INT), uint(args, o + 3, 'b2', 1, MAX_INT)
    b3, b4 = uint(args, o + 4, 'b3', 1, MAX_INT), uint(args, o + 5, 'b4', 1, MAX_INT)
    calendar_bounds(b1, b2, b3, b4)
    -- never changed once made: groups of one call with the same boundaries share it
    outer = {b1, b4}
    last_s1, last_s2, last_s3, last_s4 = s1, s2, s3, s4
    last_b2, last_b3, last_outer = b2, b3, outer
  end
  local cost, limit = parsed[args[o + 6]], parsed[args[o + 1]]
  if not (cost and limit and limit >= 1) then
    cost, limit = uint(args, o + 6, 'cost', 0, MAX_INT), uint(args, o + 1, 'limit', 1, MAX_INT)
  end
  return cost, limit, b2, b3, outer
end

-- calendar_decide decides in the window of [b1,b2) [b2,b3) [b3,b4) that holds now, outer being
-- {b1, b4}; with emit REFUND it gives `cost` units back.
local function calendar_decide(name, key, now, emit, cost, reserve, limit, b2, b3, outer)
  local now_ms = floor(now / 1000)
  local start, stop
  if now_ms < b2 then
    if now_ms >= outer[1] then
      start, stop = outer[1], b2
    end
  elseif now_ms < b3 then
    start, stop = b2, b3
  elseif now_ms < outer[2] then
    start, stop = b3, outer[2]
  end
  if not start then
    rlerr(format('%s: key %s: now %d is outside the windows from b1 %d to b4 %d: the boundaries are stale or the clock that computed them is off by more than a window',
      name, shown(key), now_ms, outer[1], outer[2]))
  end
  -- stop is a whole millisecond: the wait until it, rounded up, is stop - now_ms
  local reset = stop - now_ms
  local count = 0
  local s, c = read_state(name, key, '<dd', 16, 'calendar')
  if s then
    -- as the fixed window judges its state; the current window's start is a whole millisecond
    -- before 10^14 (now is), so the hot path only checks the count
    if s == start then
      if not (c >= 0 and c % 1 == 0) then
        foreign(name, key, 'calendar')
      end
      count = c
    elseif not (c >= 0 and c % 1 == 0 and s >= 0 and s < US_FLOOR and s % 1 == 0) then
      foreign(name, key, 'calendar')
    end
  end
  -- from here on `s and count == 0` is a key that holds another window (or a count of 0): the
  -- initial state, which every writing call replaces or deletes

  if emit == REFUND then
    if not s then
      return {1, limit, limit, 0, 0, 0}
    end
    count = count - cost
    if count <= 0 then
      rcall('DEL', key)
      return {1, limit, limit, 0, 0, 0}
    end
    if cost > 0 then
      rcall('SET', key, spack('<dd', start, count), 'PXAT', stop)
    end
    return reply(true, limit, limit - count, 0, reset, 0)
  end
  local need = cost + reserve
  if need > limit or count + need > limit then
    if emit and s and count == 0 then
      emit('DEL', key)
    end
    -- the next window starts empty, so it admits any need <= limit
    return reply(false, limit, limit - count - reserve, need > limit and -1 or reset,
      count > 0 and reset or 0, 0)
  end
  if emit and cost > 0 then
    if s and count == 0 and emit ~= rcall then
      -- rl_multi: if another limit denies, the SET below does not run, and the other window
      -- must still go
      emit('DEL', key)
    end
    count = count + cost
    emit('SET', key, spack('<dd', start, count), 'PXAT', stop)
    local remaining = limit - count - reserve
    return {1, limit, remaining > 0 and remaining or 0, 0, reset, 0}
  end
  if emit and s and count == 0 then
    emit('DEL', key)
  end
  return reply(true, limit, limit - count - reserve, 0, count > 0 and reset or 0, 0)
end

local calendar = {
  name = 'calendar',
  args = CALENDAR_ARGS,
  parse = parse_calendar,
  decide = calendar_decide,
  refund = refund_via(calendar_decide),
  -- the end of the window that holds now (calendar_decide has refused a now outside them)
  horizon = function(now_ms, r, limit, b2, b3, outer)
    if now_ms < b2 then
      return b2
    elseif now_ms < b3 then
      return b3
    end
    return outer[2]
  end,
}

local ALGORITHMS = {fixed_window, sliding_log, sliding_window, token_bucket, leaky_bucket, calendar}

-- check_keys refuses any number of keys but one.
local function check_keys(name, keys)
  if #keys ~= 1 then
    rlerr(format('%s takes exactly 1 key, got %d', name, #keys))
  end
end

local function arity(name, names, optional, got)
  if optional then
    rlerr(format('%s takes %d or %d arguments (%s [%s]), got %d', name, #names, #names + 1,
      concat(names, ' '), optional, got))
  end
  rlerr(format('%s takes %d arguments (%s), got %d', name, #names, concat(names, ' '), got))
end

--[[
rl_<algorithm>, rl_<algorithm>_peek: the limiter and its no-writes twin, ARGV as the
descriptor's args, then an optional reserve.
]]
local function limiter_call(d, name, keys, args, emit)
  if #keys ~= 1 then
    check_keys(name, keys)
  end
  local n, got = d.nargs, #args
  if got ~= n and got ~= n + 1 then
    arity(name, d.args, 'reserve', got)
  end
  local cost, limit, a, b, c = d.parse(args, 0)
  local reserve = 0
  if got > n then
    reserve = uint(args, got, 'reserve', 0, limit)
  end
  -- TIME written out rather than now_us(): a Lua call costs about 400 instructions
  local t = rcall('TIME')
  return d.decide(name, keys[1], t[1] * 1000000 + t[2], emit, cost, reserve, limit, a, b, c)
end

--[[
rl_<algorithm>_refund: ARGV as the limiter's without reserve; `cost` is the number of units
given back, 0..10^15-1, capped at what the state holds. Replies with the limiter's state after
the refund (allowed 1, retry_after_ms 0, delay_ms 0); an absent key is left absent. Not
idempotent: a client never retries a refund on its own.
]]
local function refund_call(d, name, keys, args)
  check_keys(name, keys)
  if #args ~= d.nargs then
    arity(name, d.args, nil, #args)
  end
  local n, limit, a, b, c = d.parse(args, 0)
  return d.refund(name, keys[1], now_us(), n, limit, a, b, c)
end

--[[
A block: a principal denied until a time, set by hand (rl_block) or as a penalty by rl_multi.
  KEYS[1] -> state: string struct.pack('<d', blocked_until_ms), 8 bytes, a whole millisecond
             from 1 to below 10^14, expiring at blocked_until_ms
  The key is blocked while now < blocked_until_ms; a block that has ended is no block, and a
  call that writes and finds one deletes its key.
]]

-- block_until reads a block key: nil when it does not exist, else blocked_until_ms.
local function block_until(name, key)
  local v = rpcall('GET', key)
  if type(v) == 'table' then
    wrongtype(name, key, v)
  end
  if not v then
    return nil
  end
  if #v ~= 8 then
    foreign(name, key, 'block')
  end
  local ends = sunpack('<d', v)
  -- x % 1 is NaN for an infinity or NaN
  if not (ends >= 1 and ends < US_FLOOR and ends % 1 == 0) then
    foreign(name, key, 'block')
  end
  return ends
end

-- block_left is a block's remaining time at now_ms, 0 when not blocked; with emit, a block
-- that has ended is deleted through it.
local function block_left(name, key, now_ms, emit)
  local ends = block_until(name, key)
  if not ends then
    return 0
  end
  if ends > now_ms then
    return ends - now_ms
  end
  if emit then
    emit('DEL', key)
  end
  return 0
end

--[[
rl_multi / rl_multi_peek
  KEYS    -> 1 to 16 distinct keys in one cluster slot
  ARGV    -> one group per key, in key order: the algorithm's name, then all of its limiter's
             arguments, reserve included (a fixed length per algorithm); or `block
             penalty_ms` (0..10^11) naming a block key beside the limits it guards
  All or nothing: every limit is judged at the same server time; if all admit, all consume,
  else none does. Replies with the binding limit's six integers (when denied, the denier with
  the longest retry_after_ms, -1 above all; when admitted, the one with the fewest remaining;
  ties to the first in key order), reset_after_ms the maximum over all, delay_ms the maximum
  when admitted (0 when denied), then the binding limit's 1-based index.
  Blocks: a blocked key denies as {0, 0, 0, left, left, 0}, and while any is blocked the call
  writes nothing but cleanup (a request refused during a block never lengthens it). Otherwise,
  when a limit denies (rl_multi only), every block group with penalty_ms > 0 is set to now +
  penalty_ms and denies as {0, 0, 0, penalty_ms, penalty_ms, 0}. A block group that does not
  deny is not a limit: it never binds and adds nothing to reset_after_ms. At least one group
  must be a limit.
  Holds (1.3.0): a group `hold id ttl_ms keep` follows a limit group and names its hold key; the
  limit's cost is held under id (see hold_call), all or nothing with the rest, and every hold
  key of the call is swept first. A hold group is not a limit either.
  An optional last argument `replies` (1.3.0) appends six integers per group, in key order:
  a limit's own reply, a block's, a hold's {1, 0, held, 0, expires_after_ms, 0}.
]]
local by_name = {}
local block_group = {name = 'block'}
by_name.block = block_group

-- Scratch tables reused by every rl_multi call (calls never overlap): a table allocated per
-- call costs the garbage collector's work besides its own, more than the rest of the parse.
-- groups holds GROUP slots per group: descriptor, cost, reserve, limit and its 3 parameters
-- (a block group: its descriptor and penalty_ms; a hold group: its descriptor, id, ttl_ms and
-- keep).
local GROUP = 7
local groups, replies, pending, npending = {}, {}, {}, 0
local function defer(...)
  npending = npending + 1
  pending[npending] = {...}
end

--[[
Holds (1.3.0): units of a limiter taken now under an id, given back when the hold expires
unless it is settled first (or kept charged, when made so).
  KEYS[1] -> the limiter's key, its algorithm's own state (a hold takes units as its limiter
             call does: same bytes, same expiry)
  KEYS[2] -> the hold key: a hash
               ''    -> struct.pack('<dd', next_ms, until_ms): next_ms is at or before the
                        earliest expiry of its holds (a sweep runs when now reaches it),
                        until_ms the key's expiry, the latest horizon of the holds written
               <id>  -> struct.pack('<dddd', expires_ms, horizon_ms, held, keep)
  A hold is live while now < expires_ms = min(now + ttl_ms, horizon_ms) of its last admitted
  call; horizon_ms is how long the limiter can give its units back (descriptor.horizon). The
  sweep, run first by every call given the hold key, removes expired holds and gives the units
  of those with keep 0 back through the algorithm's refund, if it runs before their horizon.
]]
local hold_group = {name = 'hold'}
by_name.hold = hold_group
local HOLD_ALGORITHMS = 'fixed_window, sliding_window, token_bucket, leaky_bucket or calendar'

-- hold_id validates a holder's id: 1 to 128 bytes (never '', the marker).
local function hold_id(args, i)
  local id = args[i]
  if #id < 1 or #id > MAX_ID then
    rlerr(format('id must be 1 to %d bytes, got %d', MAX_ID, #id))
  end
  return id
end

local function hold_keep(args, i)
  local keep = args[i]
  if keep ~= '0' and keep ~= '1' then
    rlerr(format("keep must be '0' or '1', got %s", shown(keep)))
  end
  return keep == '1' and 1 or 0
end

-- hold_record unpacks and checks one hold: expires_ms, horizon_ms, held, keep.
local function hold_record(name, key, v)
  local e, hz, held, keep
  if #v == 32 then
    e, hz, held, keep = sunpack('<dddd', v)
  end
  -- whole milliseconds from 1 to below 10^14, written out: x % 1 is NaN for an infinity or NaN
  if not (e and e >= 1 and e <= hz and hz < US_FLOOR and e % 1 == 0 and hz % 1 == 0 and held >= 0
      and held % 1 == 0 and (keep == 0 or keep == 1)) then
    foreign(name, key, 'hold')
  end
  return e, hz, held, keep
end

-- The marker last read and found valid, and its numbers: a hold key's marker changes only when
-- a hold expires earlier than any or lasts past the key's expiry, and windows of one length
-- share theirs, so most calls read the one seen last (strings are interned: comparing them
-- compares pointers), and skip its unpacking and checks.
local last_mark, last_nxt, last_untl

-- hold_marker unpacks and checks a marker other than the last one: next_ms, until_ms.
local function hold_marker(name, key, m)
  local nxt, untl
  if #m == 16 then
    nxt, untl = sunpack('<dd', m)
  end
  if not (nxt and nxt >= 1 and untl >= 1 and nxt < US_FLOOR and untl < US_FLOOR and nxt % 1 == 0 and untl % 1 == 0) then
    foreign(name, key, 'hold')
  end
  last_mark, last_nxt, last_untl = m, nxt, untl
  return nxt, untl
end

-- hold_read reads a hold key's marker and id's hold, before anything is written: nil when the
-- key does not exist, else next_ms, until_ms, then id's expires_ms, horizon_ms, held and keep
-- (nil when id holds nothing). A hash without the marker is foreign.
local function hold_read(name, key, id)
  local v = rpcall('HMGET', key, '', id)
  local m = v[1]
  if not m then
    if v.err then
      wrongtype(name, key, v)
    end
    if v[2] or rcall('EXISTS', key) == 1 then
      foreign(name, key, 'hold')
    end
    return nil
  end
  local nxt, untl = last_nxt, last_untl
  if m ~= last_mark then
    nxt, untl = hold_marker(name, key, m)
  end
  if v[2] then
    return nxt, untl, hold_record(name, key, v[2])
  end
  return nxt, untl
end

-- hold_sweep reads every hold of key at now_ms: the units to give back (expired, keep 0,
-- before their horizon), the expired holds' ids, the earliest expiry of the live ones (nil
-- for none).
local function hold_sweep(name, key, now_ms)
  local all = rcall('HGETALL', key)
  local give, dead, nxt = 0, {}, nil
  for i = 1, #all, 2 do
    local f = all[i]
    if f ~= '' then
      local e, hz, held, keep = hold_record(name, key, all[i + 1])
      if e <= now_ms then
        dead[#dead + 1] = f
        if keep == 0 and now_ms < hz then
          give = give + held
        end
      elseif not nxt or e < nxt then
        nxt = e
      end
    end
  end
  return give, dead, nxt
end

-- hold_hdel deletes the holds named in ids, in batches (unpack is limited by the C stack).
local function hold_hdel(key, ids)
  local n, i = #ids, 1
  while i <= n do
    local last = min(n, i + ZADD_BATCH - 1)
    rcall('HDEL', key, unpack(ids, i, last))
    i = last + 1
  end
end

-- hold_remove deletes the holds named in ids, and the key when no hold is left. Removing holds
-- never makes the marker wrong (next_ms stays at or before the earliest expiry left), so it is
-- written only after a sweep (swept), which sets next_ms to the earliest expiry of the holds
-- left, nxt (nil: none known, "sweep at the next call").
local function hold_remove(key, ids, nxt, untl, now_ms, swept)
  hold_hdel(key, ids)
  if rcall('HLEN', key) <= 1 then
    rcall('DEL', key)
  elseif swept then
    rcall('HSET', key, '', spack('<dd', nxt or now_ms, untl))
  end
end

-- hold_write makes or renews id's hold of `held` units, after the limiter has taken them,
-- expiring at min(now + ttl, horizon); nxt and untl are the marker's (nil for a key that does
-- not exist; nxt nil also for one without a live hold), swept says a sweep of this call set
-- nxt. Returns the time until it expires: 0 when the horizon is now (a full bucket gives
-- nothing back): then there is no hold.
-- The marker is written only when it changes: after a sweep, for a hold that expires before
-- next_ms, or for a horizon past the key's expiry, which moves it to the horizon + 1000 ms
-- (the TTL rule's margin: a bucket's horizon grows with every call, and a PEXPIREAT costs
-- about 4.5k instructions, the marker's write 3k more; callgrind). hold_call has it written out.
local function hold_write(key, id, now_ms, ttl, horizon, held, keep, nxt, untl, swept)
  local e = now_ms + ttl
  if e > horizon then
    e = horizon
  end
  if e <= now_ms then
    if untl then
      hold_remove(key, {id}, nxt, untl, now_ms, swept)
    end
    return 0
  end
  if untl and horizon <= untl then
    if not swept and nxt and nxt <= e then
      rcall('HSET', key, id, spack('<dddd', e, horizon, held, keep))
    else
      if not nxt or e < nxt then
        nxt = e
      end
      rcall('HSET', key, '', spack('<dd', nxt, untl), id, spack('<dddd', e, horizon, held, keep))
    end
  else
    untl = horizon + 1000
    if not nxt or e < nxt then
      nxt = e
    end
    rcall('HSET', key, '', spack('<dd', nxt, untl), id, spack('<dddd', e, horizon, held, keep))
    rcall('PEXPIREAT', key, untl)
  end
  return e - now_ms
end

-- hold_parse validates a limit group from args[o+1] for a hold: the descriptor, then its cost,
-- reserve, limit and parameters, then the offset after the group.
local function hold_parse(name, args, o)
  local alg = args[o + 1]
  local d = alg and by_name[alg]
  if not d then
    rlerr(format('%s: unknown algorithm %s (%s)', name, alg and shown(alg) or 'missing', HOLD_ALGORITHMS))
  end
  if not d.horizon then
    rlerr(format("%s: algorithm %s cannot be held (%s)", name, shown(alg), HOLD_ALGORITHMS))
  end
  if #args < o + 2 + d.nargs then
    rlerr(format('%s: the group %s takes %d arguments (%s reserve), got %d', name, alg, d.nargs + 1,
      concat(d.args, ' '), #args - o - 1))
  end
  local cost, limit, a, b, c = d.parse(args, o + 1)
  local reserve = uint(args, o + d.nargs + 2, 'reserve', 0, limit)
  return d, cost, reserve, limit, a, b, c, o + d.nargs + 2
end

--[[
rl_hold / rl_hold_settle
  KEYS    -> the limiter's key, its hold key (one slot)
  ARGV    -> rl_hold: a limit group (as rl_multi's: algorithm, its arguments, reserve), then
               id       1..128 bytes
               ttl_ms   1..10^11
               keep     '0': an expired hold's units are given back; '1': they stay charged
             rl_hold_settle: a limit group whose cost is the actual amount, then id
  rl_hold takes cost under id (a new hold, or more for a live one, renewed); rl_hold_settle
  gives back held - actual, or takes actual - held as far as the limit has room, and removes
  the hold. Both reply the limiter's six integers, then held and expires_after_ms (settle: -1
  when id had no live hold, and then nothing is charged).
]]
local function hold_call(name, keys, args, settle)
  local key, hkey = keys[1], keys[2]
  if #keys ~= 2 then
    rlerr(format("%s takes exactly 2 keys (the limiter's and its hold key), got %d", name, #keys))
  end
  if key == hkey then
    rlerr(format('%s: key %s is given twice', name, shown(key)))
  end
  -- The arguments are checked inline on the hot path (a Lua call costs about 400 instructions,
  -- and this one runs on every hold); anything odd goes through hold_parse and the checks
  -- below it, which raise the RLERR.
  local d = by_name[args[1] or '']
  local o = d and d.horizon and d.nargs + 2 -- the reserve's index: id follows it
  local cost, reserve, limit, a, b, c
  if o and #args == o + (settle and 1 or 3) then
    cost, limit, a, b, c = d.parse(args, 1)
    reserve = parsed[args[o]]
    if not (reserve and reserve <= limit) then
      reserve = uint(args, o, 'reserve', 0, limit)
    end
  else
    d, cost, reserve, limit, a, b, c, o = hold_parse(name, args, 0)
    local want = o + (settle and 1 or 3)
    rlerr(format('%s takes %d arguments (the %s group, then %s), got %d', name, want, d.name,
      settle and 'id' or 'id ttl_ms keep', #args))
  end
  local id = args[o + 1]
  if #id < 1 or #id > MAX_ID then
    hold_id(args, o + 1)
  end
  local ttl, keep
  if not settle then
    ttl = parsed[args[o + 2]]
    if not (ttl and ttl >= 1 and ttl <= MAX_DURATION_MS) then
      ttl = uint(args, o + 2, 'ttl_ms', 1, MAX_DURATION_MS)
    end
    keep = args[o + 3]
    if keep == '0' then
      keep = 0
    elseif keep == '1' then
      keep = 1
    else
      hold_keep(args, o + 3)
    end
  end
  local t = rcall('TIME')
  local now = t[1] * 1000000 + t[2]
  local now_ms = floor(now / 1000)
  -- hold_read written out
  local v = rpcall('HMGET', hkey, '', id)
  local m, rec = v[1], v[2]
  local nxt, untl, e, held
  if m then
    if m == last_mark then
      nxt, untl = last_nxt, last_untl
    else
      nxt, untl = hold_marker(name, hkey, m)
    end
    if rec then
      local _
      e, _, held = hold_record(name, hkey, rec)
    end
  elseif v.err then
    wrongtype(name, hkey, v)
  elseif rec or rcall('EXISTS', hkey) == 1 then
    foreign(name, hkey, 'hold')
  end
  local dead
  if nxt and nxt <= now_ms then
    local give
    give, dead, nxt = hold_sweep(name, hkey, now_ms)
    if give > 0 then
      d.refund(name, key, now, give, limit, a, b, c)
    end
  end
  if not e or e <= now_ms then
    e, held = nil, 0 -- none, or expired: swept above
  end

  if not settle then
    local r = d.decide(name, key, now, rcall, cost, reserve, limit, a, b, c)
    local left = e and e - now_ms or 0
    if r[1] == 1 and (cost > 0 or e) then
      if dead then
        hold_hdel(hkey, dead)
      end
      held = held + cost
      -- hold_write written out: a call of ten arguments costs about 1k instructions
      local horizon, hf = nil, d.horizon
      if hf == bucket_horizon then
        horizon = now_ms + r[5] -- bucket_horizon and window_horizon written out
      elseif hf == window_horizon then
        horizon = now_ms - fmod(now_ms, a) + a
      else
        horizon = hf(now_ms, r, limit, a, b, c)
      end
      local exp = now_ms + ttl
      if exp > horizon then
        exp = horizon
      end
      if exp <= now_ms then
        if untl then
          hold_remove(hkey, {id}, nxt, untl, now_ms, dead)
        end
        held, left = 0, 0
      else
        left = exp - now_ms
        if untl and horizon <= untl then
          if not dead and nxt and nxt <= exp then
            rcall('HSET', hkey, id, spack('<dddd', exp, horizon, held, keep))
          else
            if not nxt or exp < nxt then
              nxt = exp
            end
            rcall('HSET', hkey, '', spack('<dd', nxt, untl), id, spack('<dddd', exp, horizon, held, keep))
          end
        else
          untl = horizon + 1000
          if not nxt or exp < nxt then
            nxt = exp
          end
          rcall('HSET', hkey, '', spack('<dd', nxt, untl), id, spack('<dddd', exp, horizon, held, keep))
          rcall('PEXPIREAT', hkey, untl)
        end
      end
    elseif dead then
      hold_remove(hkey, dead, nxt, untl, now_ms, true)
    end
    -- the limiter's reply, made by decide for this call alone, grows its two integers
    r[7], r[8] = held, left
    return r
  end

  if not e then
    if dead then
      hold_remove(hkey, dead, nxt, untl, now_ms, true)
    end
    local p = d.decide(name, key, now, nil, 0, reserve, limit, a, b, c)
    return {0, p[2], p[3], 0, p[5], 0, 0, -1}
  end
  local charged = cost
  if cost < held then
    d.refund(name, key, now, held - cost, limit, a, b, c)
  elseif cost > held then
    local r = d.decide(name, key, now, rcall, cost - held, reserve, limit, a, b, c)
    if r[1] == 0 then
      -- the extra does not fit: take what does
      charged = held
      local room = r[3]
      if room > 0 and d.decide(name, key, now, rcall, room, reserve, limit, a, b, c)[1] == 1 then
        charged = held + room
      end
    end
  end
  local ids = dead or {}
  ids[#ids + 1] = id
  hold_remove(hkey, ids, nxt, untl, now_ms, dead)
  local p = d.decide(name, key, now, nil, 0, reserve, limit, a, b, c)
  return {charged == cost and 1 or 0, p[2], p[3], 0, p[5], 0, charged, 0}
end

-- hold_prepare reads every hold group's hold key before rl_multi decides, and (write) sweeps
-- it: expired holds' units are given back to the limit the group follows before the decision,
-- after every limit and block of the call has been checked as its peek checks it, so that a
-- foreign key refuses the call before anything is written. Returns one state per hold group.
local function hold_prepare(name, keys, nkeys, now, write)
  local now_ms = floor(now / 1000)
  local hs, give = {}, false
  for i = 1, nkeys do
    local g = (i - 1) * GROUP
    if groups[g + 1] == hold_group then
      local st = {}
      st.nxt, st.untl, st.e, st.hz, st.held = hold_read(name, keys[i], groups[g + 2])
      if write and st.nxt and st.nxt <= now_ms then
        st.give, st.dead, st.nxt = hold_sweep(name, keys[i], now_ms)
        if st.give > 0 then
          give = true
        end
      end
      if not st.e or st.e <= now_ms then
        st.e, st.held = nil, 0
      end
      hs[i] = st
    end
  end
  if give then
    for i = 1, nkeys do
      local g = (i - 1) * GROUP
      local d = groups[g + 1]
      if d == block_group then
        block_until(name, keys[i])
      elseif d ~= hold_group then
        d.decide(name, keys[i], now, nil, groups[g + 2], groups[g + 3], groups[g + 4], groups[g + 5],
          groups[g + 6], groups[g + 7])
      end
    end
    for i = 1, nkeys do
      local st = hs[i]
      if st and st.give and st.give > 0 then
        local g = (i - 2) * GROUP
        groups[g + 1].refund(name, keys[i - 1], now, st.give, groups[g + 4], groups[g + 5], groups[g + 6], groups[g + 7])
      end
    end
  end
  return hs
end

-- hold_finish writes every hold group's hold after the decision: when it admitted (write), the
-- cost of the limit before it is added and the hold renewed; else only the sweep's removals.
-- Each hold group's reply becomes {1, 0, held, 0, expires_after_ms, 0}.
local function hold_finish(keys, nkeys, now, hs, write, allowed)
  local now_ms = floor(now / 1000)
  for i = 1, nkeys do
    local st = hs[i]
    if st then
      local g = (i - 1) * GROUP
      local held, left = st.held, st.e and st.e - now_ms or 0
      if write then
        local lg = g - GROUP
        local cost = groups[lg + 2]
        if allowed and (cost > 0 or st.e) then
          if st.dead then
            hold_hdel(keys[i], st.dead)
          end
          held = held + cost
          left = hold_write(keys[i], groups[g + 2], now_ms, groups[g + 3],
            groups[lg + 1].horizon(now_ms, replies[i - 1], groups[lg + 4], groups[lg + 5], groups[lg + 6], groups[lg + 7]),
            held, groups[g + 4], st.nxt, st.untl, st.dead)
          if left == 0 then
            held = 0
          end
        elseif st.dead then
          hold_remove(keys[i], st.dead, st.nxt, st.untl, now_ms, true)
        end
      end
      replies[i] = {1, 0, held, 0, left, 0}
    end
  end
end

local UNBLOCKED = {1, 0, 0, 0, 0, 0}

local function multi_call(name, keys, args, write)
  local nkeys = #keys
  if nkeys < 1 or nkeys > MAX_MULTI then
    rlerr(format('%s takes 1 to %d keys, got %d', name, MAX_MULTI, nkeys))
  end
  for i = 2, nkeys do
    for j = 1, i - 1 do
      if keys[i] == keys[j] then
        rlerr(format('%s: key %s is given twice (keys %d and %d)', name, shown(keys[i]), j, i))
      end
    end
  end
  -- parse every group before deciding anything
  local o, nblocks, nholds = 0, 0, 0
  for i = 1, nkeys do
    local alg = args[o + 1]
    local d = alg and by_name[alg]
    if not d then
      group_i = nil -- the previous group's: this error names its group itself
      if not alg then
        rlerr(format('%s: group %d (key %d) is missing: %d keys take %d groups', name, i, i, nkeys, nkeys))
      end
      rlerr(format("%s: group %d: unknown algorithm %s (fixed_window, sliding_log, sliding_window, token_bucket, leaky_bucket, calendar, block or hold)", name, i, shown(alg)))
    end
    local g = (i - 1) * GROUP
    if d == block_group then
      if #args < o + 2 then
        group_i = nil
        rlerr(format('%s: group %d (block) takes 1 argument (penalty_ms), got 0', name, i))
      end
      group_i, group_alg, group_fn = i, alg, name
      groups[g + 1], groups[g + 2] = d, uint(args, o + 2, 'penalty_ms', 0, MAX_DURATION_MS)
      nblocks = nblocks + 1
      o = o + 2
    elseif d == hold_group then
      if #args < o + 4 then
        group_i = nil
        rlerr(format('%s: group %d (hold) takes 3 arguments (id ttl_ms keep), got %d', name, i, #args - o - 1))
      end
      group_i, group_alg, group_fn = i, alg, name
      local prev = i > 1 and groups[g - GROUP + 1]
      if not (prev and prev.horizon) then
        rlerr(format('a hold group follows the limit group it holds (%s)', HOLD_ALGORITHMS))
      end
      groups[g + 1], groups[g + 2] = d, hold_id(args, o + 2)
      groups[g + 3], groups[g + 4] = uint(args, o + 3, 'ttl_ms', 1, MAX_DURATION_MS), hold_keep(args, o + 4)
      nholds = nholds + 1
      o = o + 4
    else
      if #args < o + 2 + d.nargs then
        group_i = nil
        rlerr(format('%s: group %d (%s) takes %d arguments (%s reserve), got %d', name, i, alg,
          d.nargs + 1, concat(d.args, ' '), #args - o - 1))
      end
      group_i, group_alg, group_fn = i, alg, name
      local cost, limit, a, b, c = d.parse(args, o + 1)
      local reserve = uint(args, o + d.nargs + 2, 'reserve', 0, limit)
      groups[g + 1], groups[g + 2], groups[g + 3], groups[g + 4] = d, cost, reserve, limit
      groups[g + 5], groups[g + 6], groups[g + 7] = a, b, c
      o = o + d.nargs + 2
    end
  end
  group_i = nil
  local all = false
  if #args ~= o then
    -- the one optional argument after the groups (1.3.0): every group's reply
    if #args == o + 1 and args[o + 1] == 'replies' then
      all = true
    else
      rlerr(format('%s: %d groups take %d arguments, or %d with replies, got %d', name, nkeys, o, o + 1, #args))
    end
  end
  if nblocks == nkeys then
    rlerr(format('%s: every group is a block: a decision needs at least one limit', name))
  end

  local t = rcall('TIME')
  local now = t[1] * 1000000 + t[2]
  npending = 0
  local emit = write and defer or nil
  -- every limit (and block) is judged, and any RLERR raised, before anything is written:
  -- writes are deferred through emit
  local bind_i, bind, allowed = 0, nil, true
  local reset, delay = 0, 0
  local penalize = false
  local hs
  if nholds > 0 then
    hs = hold_prepare(name, keys, nkeys, now, write)
  end
  if nblocks == 0 and nholds == 0 then
    -- no block: the binding limit is chosen as the replies come (the hot path of a multi)
    for i = 1, nkeys do
      local g = (i - 1) * GROUP
      local r = groups[g + 1].decide(name, keys[i], now, emit, groups[g + 2], groups[g + 3],
        groups[g + 4], groups[g + 5], groups[g + 6], groups[g + 7])
      replies[i] = r
      if r[5] > reset then
        reset = r[5]
      end
      if r[6] > delay then
        delay = r[6]
      end
      if r[1] == 0 then
        -- the denier with the longest wait binds, and never (-1) is the longest
        if allowed or (bind[4] ~= -1 and (r[4] == -1 or r[4] > bind[4])) then
          bind_i, bind = i, r
        end
        allowed = false
      elseif allowed and (not bind or r[3] < bind[3]) then
        bind_i, bind = i, r
      end
    end
  else
    -- blocks: whether any limit denies decides the penalties, which then deny too, so the
    -- binding limit is chosen once every reply is known
    local blocked, denied = false, false
    for i = 1, nkeys do
      local g = (i - 1) * GROUP
      local d = groups[g + 1]
      if d == block_group then
        local left = block_left(name, keys[i], floor(now / 1000), emit)
        if left > 0 then
          blocked = true
          replies[i] = {0, 0, 0, left, left, 0}
        else
          replies[i] = false -- not a limit: never binds, adds nothing to reset_after_ms
        end
      elseif d == hold_group then
        replies[i] = false -- not a limit either
      else
        local r = d.decide(name, keys[i], now, emit, groups[g + 2], groups[g + 3], groups[g + 4],
          groups[g + 5], groups[g + 6], groups[g + 7])
        replies[i] = r
        if r[1] == 0 then
          denied = true
        end
      end
    end
    -- a denial outside any block starts the penalties now (set below, with the other writes);
    -- a denial during a block sets none, so a refused request never lengthens it
    penalize = denied and write and not blocked
    if penalize then
      for i = 1, nkeys do
        local g = (i - 1) * GROUP
        local p = groups[g + 2]
        if groups[g + 1] == block_group and p > 0 then
          replies[i] = {0, 0, 0, p, p, 0}
        end
      end
    end
    for i = 1, nkeys do
      local r = replies[i]
      if r then
        if r[5] > reset then
          reset = r[5]
        end
        if r[6] > delay then
          delay = r[6]
        end
        if r[1] == 0 then
          if allowed or (bind[4] ~= -1 and (r[4] == -1 or r[4] > bind[4])) then
            bind_i, bind = i, r
          end
          allowed = false
        elseif allowed and (not bind or r[3] < bind[3]) then
          bind_i, bind = i, r
        end
      end
    end
  end
  if allowed then
    for i = 1, npending do
      rcall(unpack(pending[i]))
    end
  else
    delay = 0
    -- cleanups (deleting a key in its initial state, dropping a log's ended entries, deleting
    -- an ended block) are no consumption
    for i = 1, npending do
      local op = pending[i][1]
      if op == 'DEL' or op == 'ZREMRANGEBYSCORE' then
        rcall(unpack(pending[i]))
      end
    end
    if penalize then
      local now_ms = floor(now / 1000)
      for i = 1, nkeys do
        local g = (i - 1) * GROUP
        local p = groups[g + 2]
        if groups[g + 1] == block_group and p > 0 then
          rcall('SET', keys[i], spack('<d', now_ms + p), 'PXAT', now_ms + p)
        end
      end
    end
    if write then
      -- an admitting limit's reset described it after a consumption that did not happen: its
      -- reset is the one it has now
      reset = 0
      for i = 1, nkeys do
        local g, r = (i - 1) * GROUP, replies[i]
        if r and r[1] == 1 and groups[g + 2] > 0 then
          r = groups[g + 1].decide(name, keys[i], now, nil, groups[g + 2], groups[g + 3],
            groups[g + 4], groups[g + 5], groups[g + 6], groups[g + 7])
          replies[i] = r
        end
        if r and r[5] > reset then
          reset = r[5]
        end
      end
    end
  end
  if hs then
    hold_finish(keys, nkeys, now, hs, write, allowed)
  end
  local out = {bind[1], bind[2], bind[3], bind[4], reset, delay, bind_i}
  if all then
    for i = 1, nkeys do
      local r = replies[i] or UNBLOCKED
      local k = 1 + i * 6
      out[k + 1], out[k + 2], out[k + 3], out[k + 4], out[k + 5], out[k + 6] = r[1], r[2], r[3], r[4], r[5], r[6]
    end
  end
  -- drop the references, so that the scratch tables keep no state alive between calls
  for i = 1, npending do
    pending[i] = nil
  end
  for i = 1, nkeys do
    replies[i] = nil
  end
  npending = 0
  return out
end

--[[
rl_concurrency / rl_concurrency_peek / rl_concurrency_release
  KEYS[1] -> state: sorted set holding the marker member '' scored 0 (which tells it from a
             sliding log) and one member per lease, its holder's id, scored by the
             millisecond at which it expires; the key expires with its last lease
  ARGV    -> limit      slots, 1..10^15-1
             lease_ms   1..10^11: a lease taken or renewed now ends at now + lease_ms (in whole
                        milliseconds of server time: up to 1 ms early, never late)
             id         the holder, 1 to 128 bytes
             [reserve]  0..limit slots that must stay free after a new holder takes one
                        (ignored by release and by renewals)
  rl_concurrency takes a slot for id, or renews id's lease: a renewal is always admitted.
  rl_concurrency_release frees id's slot: allowed 1 if it held one, 0 if not.
]]
local CONC_ARGS = {'limit', 'lease_ms', 'id'}

local function parse_concurrency(name, keys, args)
  check_keys(name, keys)
  local got = #args
  if got ~= 3 and got ~= 4 then
    arity(name, CONC_ARGS, 'reserve', got)
  end
  local limit = uint(args, 1, 'limit', 1, MAX_INT)
  local lease = uint(args, 2, 'lease_ms', 1, MAX_DURATION_MS)
  local id = args[3]
  if #id < 1 or #id > MAX_ID then
    rlerr(format('id must be 1 to %d bytes, got %d', MAX_ID, #id))
  end
  local reserve = 0
  if got == 4 then
    reserve = uint(args, 4, 'reserve', 0, limit)
  end
  return keys[1], limit, lease, id, reserve
end

-- lease_state reads a concurrency key's first and last members, before anything is written:
-- nil when the key does not exist, else the expiry (ms) of the lease that ends last (0 with
-- none) and its holder. The first member must be the marker '' scored 0 (a sliding log, any
-- other sorted set, a member scored below the marker are foreign) and the last an integer
-- millisecond (an infinite score is foreign).
local function lease_state(name, key)
  local first = rpcall('ZRANGE', key, 0, 0, 'WITHSCORES')
  if first.err then
    wrongtype(name, key, first)
  end
  if not first[1] then
    return nil
  end
  if first[1] ~= '' or first[2] ~= '0' then
    foreign(name, key, 'concurrency')
  end
  local e = rcall('ZRANGE', key, -1, -1, 'WITHSCORES')
  if e[1] == '' then
    return 0, nil
  end
  local last = tonumber(e[2])
  if not (last < MAX_SAFE and last % 1 == 0) then
    foreign(name, key, 'concurrency')
  end
  return last, e[1]
end

-- last_expiry is the expiry (ms) of the lease that ends last, once the key holds one.
local function last_expiry(key)
  return tonumber(rcall('ZRANGE', key, -1, -1, 'WITHSCORES')[2])
end

local function concurrency(name, keys, args, write)
  local key, limit, lease, id, reserve = parse_concurrency(name, keys, args)
  local now_ms = floor(now_us() / 1000)
  local last, last_id = lease_state(name, key)
  local exists = last ~= nil
  local count, held = 0, false
  if exists then
    if write then
      -- expired leases are dropped before the decision (the last lease stays if any does)
      rcall('ZREMRANGEBYSCORE', key, '(0', now_ms)
      count = rcall('ZCARD', key) - 1
      if count == 0 then
        rcall('DEL', key)
        exists = false
      else
        -- rcall: an error (an ACL without ZSCORE) must fail the call, never read as a lease held
        held = rcall('ZSCORE', key, id) ~= false
      end
    else
      count = rcall('ZCOUNT', key, '(' .. now_ms, '+inf')
      local s = rcall('ZSCORE', key, id)
      held = s ~= false and tonumber(s) > now_ms
    end
  end
  if held then
    -- a renewal: always admitted, and no second slot
    if write then
      local expiry = now_ms + lease
      rcall('ZADD', key, expiry, id)
      if expiry > last then
        last = expiry
      elseif id == last_id then
        last = last_expiry(key) -- the last lease, renewed shorter
      end
      rcall('PEXPIREAT', key, last)
    end
    return reply(true, limit, limit - count - reserve, 0, last - now_ms, 0)
  end

  if not exists or last <= now_ms then
    last = nil -- no live lease
  end
  local need = 1 + reserve
  if need > limit or count + need > limit then
    local retry = -1
    if need <= limit then
      -- the k-th lease to expire frees the slots this call needs
      local k = count + need - limit
      local e = rcall('ZRANGE', key, '(' .. now_ms, '+inf', 'BYSCORE', 'LIMIT', k - 1, 1, 'WITHSCORES')
      retry = tonumber(e[2]) - now_ms
    end
    return reply(false, limit, limit - count - reserve, retry, last and last - now_ms or 0, 0)
  end
  if write then
    local expiry = now_ms + lease
    if not last or expiry > last then
      last = expiry
    end
    if exists then
      rcall('ZADD', key, expiry, id)
    else
      rcall('ZADD', key, 0, '', expiry, id)
    end
    rcall('PEXPIREAT', key, last)
    count = count + 1
  end
  return reply(true, limit, limit - count - reserve, 0, last and last - now_ms or 0, 0)
end

local function release(name, keys, args)
  local key, limit, _, id = parse_concurrency(name, keys, args)
  local now_ms = floor(now_us() / 1000)
  local last, last_id = lease_state(name, key)
  if not last then
    return {0, limit, limit, 0, 0, 0}
  end
  rcall('ZREMRANGEBYSCORE', key, '(0', now_ms)
  local held = rcall('ZREM', key, id)
  local count = rcall('ZCARD', key) - 1
  if count == 0 then
    rcall('DEL', key) -- the last release deletes the key
    return {held, limit, limit, 0, 0, 0}
  end
  if held == 1 and id == last_id then
    last = last_expiry(key)
  end
  rcall('PEXPIREAT', key, last)
  return reply(held == 1, limit, limit - count, 0, last - now_ms, 0)
end

--[[
rl_block / rl_unblock / rl_block_peek
  KEYS[1] -> the block key (see block_until above)
  ARGV    -> rl_block: duration_ms, 1..10^11; rl_unblock and rl_block_peek: none
  rl_block sets blocked_until_ms = now + duration_ms, replacing any block (an operator may
  lengthen or shorten it); rl_unblock lifts the block, deleting the key; rl_block_peek
  (no-writes) tells whether the key is blocked. Each replies with the block after the call:
    {allowed, 0, 0, left, left, 0}
  allowed 0 while blocked, 1 when not; left = blocked_until_ms - now, 0 when not blocked. So
  rl_block replies {0, 0, 0, duration_ms, duration_ms, 0}. A key holding anything but a block
  is refused by all three, rl_unblock included: it never deletes what it does not own.
]]
local function no_args(name, args)
  if #args ~= 0 then
    rlerr(format('%s takes no arguments, got %d', name, #args))
  end
end

local function block(name, keys, args)
  check_keys(name, keys)
  if #args ~= 1 then
    arity(name, {'duration_ms'}, nil, #args)
  end
  local duration = uint(args, 1, 'duration_ms', 1, MAX_DURATION_MS)
  local key = keys[1]
  block_until(name, key) -- refuses a key that holds anything but a block
  local ends = floor(now_us() / 1000) + duration
  rcall('SET', key, spack('<d', ends), 'PXAT', ends)
  return {0, 0, 0, duration, duration, 0}
end

local function unblock(name, keys, args)
  check_keys(name, keys)
  no_args(name, args)
  if block_until(name, keys[1]) then
    rcall('DEL', keys[1])
  end
  return {1, 0, 0, 0, 0, 0}
end

local function block_peek(name, keys, args)
  check_keys(name, keys)
  no_args(name, args)
  local left = block_left(name, keys[1], floor(now_us() / 1000), nil)
  if left > 0 then
    return {0, 0, 0, left, left, 0}
  end
  return {1, 0, 0, 0, 0, 0}
end

--[[
rl_version
  no keys, no arguments -> the library's semantic version, e.g. '1.2.0'
]]
local function version(keys, args)
  if #keys ~= 0 or #args ~= 0 then
    rlerr('rl_version takes no keys and no arguments')
  end
  return VERSION
end

-- register makes an algorithm's limiter, peek and refund, and its rl_multi group; a
-- descriptor that lacks a piece fails FUNCTION LOAD rather than a call.
local function register(d)
  local fields = {'name', 'args', 'parse', 'decide', 'refund'}
  for i = 1, #fields do
    if d[fields[i]] == nil then
      error('ratelimit: algorithm ' .. (d.name or '?') .. ' has no ' .. fields[i])
    end
  end
  d.nargs = #d.args
  by_name[d.name] = d
  local name, peek, refund = 'rl_' .. d.name, 'rl_' .. d.name .. '_peek', 'rl_' .. d.name .. '_refund'
  redis.register_function{
    function_name = name,
    callback = guarded(name, function(keys, args) return limiter_call(d, name, keys, args, rcall) end),
  }
  redis.register_function{
    function_name = peek,
    callback = guarded(peek, function(keys, args) return limiter_call(d, peek, keys, args, nil) end),
    flags = {'no-writes'},
  }
  redis.register_function{
    function_name = refund,
    callback = guarded(refund, function(keys, args) return refund_call(d, refund, keys, args) end),
  }
end

for i = 1, #ALGORITHMS do
  register(ALGORITHMS[i])
end

redis.register_function{
  function_name = 'rl_multi',
  callback = guarded('rl_multi', function(keys, args) return multi_call('rl_multi', keys, args, true) end),
}
redis.register_function{
  function_name = 'rl_multi_peek',
  callback = guarded('rl_multi_peek', function(keys, args) return multi_call('rl_multi_peek', keys, args, false) end),
  flags = {'no-writes'},
}
redis.register_function{
  function_name = 'rl_concurrency',
  callback = guarded('rl_concurrency', function(keys, args) return concurrency('rl_concurrency', keys, args, true) end),
}
redis.register_function{
  function_name = 'rl_concurrency_peek',
  callback = guarded('rl_concurrency_peek', function(keys, args) return concurrency('rl_concurrency_peek', keys, args, false) end),
  flags = {'no-writes'},
}
redis.register_function{
  function_name = 'rl_concurrency_release',
  callback = guarded('rl_concurrency_release', function(keys, args) return release('rl_concurrency_release', keys, args) end),
}
redis.register_function{
  function_name = 'rl_block',
  callback = guarded('rl_block', function(keys, args) return block('rl_block', keys, args) end),
}
redis.register_function{
  function_name = 'rl_unblock',
  callback = guarded('rl_unblock', function(keys, args) return unblock('rl_unblock', keys, args) end),
}
redis.register_function{
  function_name = 'rl_block_peek',
  callback = guarded('rl_block_peek', function(keys, args) return block_peek('rl_block_peek', keys, args) end),
  flags = {'no-writes'},
}
redis.register_function{
  function_name = 'rl_hold',
  callback = guarded('rl_hold', function(keys, args) return hold_call('rl_hold', keys, args, false) end),
}
redis.register_function{
  function_name = 'rl_hold_settle',
  callback = guarded('rl_hold_settle', function(keys, args) return hold_call('rl_hold_settle', keys, args, true) end),
}
redis.register_function{
  function_name = 'rl_version',
  callback = guarded('rl_version', version),
  flags = {'no-writes', 'allow-stale'},
}
