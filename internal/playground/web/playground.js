// rlfn playground: seven cards that call the ratelimit library through the playground's API,
// and draw each decision at the server's time. Plain JS and SVG: no build step, no external
// asset, so the page works offline. Every string from the server goes in with textContent.
'use strict';

const SPAN_MS = 10000; // the timeline shows the last 10 seconds
const SVG_NS = 'http://www.w3.org/2000/svg';
// The most marks a card keeps: bursts of 100 as fast as the server answers, or a shaping queue
// whose delays keep its marks on screen for hours, must not grow the page's memory and redraw
// time without end. The counts still sum up every decision.
const MAX_MARKS = 2000;

// A card's words and how its timeline is drawn. Its numbers (their names, labels and bounds)
// come from the server with the card (status.cards[].fields): the library's bounds, as the
// client checks them, are never written here.
const INFO = {
  fixed_window: {
    title: 'Fixed window', edges: true,
    blurb: 'At most Limit per window, windows aligned to the clock. One counter: cheap, but up to twice the limit passes around an edge.',
  },
  sliding_log: {
    title: 'Sliding log',
    blurb: 'At most Limit in any span of Window, exactly: one log entry per request, so memory grows with the limit.',
  },
  sliding_window: {
    title: 'Sliding window', edges: true,
    blurb: "The previous window's count, weighted by how much of it the span still covers, plus the current one: close to exact, constant memory.",
  },
  token_bucket: {
    title: 'Token bucket',
    blurb: 'Bursts up to Capacity at once, then Rate per Period as tokens refill, continuously.',
  },
  leaky_police: {
    title: 'Leaky bucket · police',
    blurb: 'A queue of Capacity that leaks Rate per Period: admits what fits now, rejects the overflow at once.',
  },
  leaky_shape: {
    title: 'Leaky bucket · shape', shaped: true,
    blurb: 'The same bucket, admitting with a delay: requests leave evenly spaced, and are rejected only when the queue is full.',
  },
  calendar: {
    title: 'Calendar · day',
    blurb: "At most Limit per calendar day, each starting at the anchor's clock time in its zone. Here the first window ends a minute or two after the page loaded: watch the quota start again.",
  },
};
const DAY_MS = 86400000;

const cards = new Map();
let offset = null; // server time minus performance.now(), in ms

function serverNow() {
  return offset === null ? Date.now() : performance.now() + offset;
}

function syncClock(now) {
  if (typeof now === 'number' && now > 0) offset = now - performance.now();
}

async function api(path, body) {
  const init = body === undefined ? {} : {
    method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body),
  };
  let resp;
  try {
    resp = await fetch(path, init);
  } catch (e) {
    return { ok: false, down: true, body: { error: 'the playground does not answer: is rlfn playground still running?' } };
  }
  let data = {};
  try { data = await resp.json(); } catch (e) { data = { error: 'HTTP ' + resp.status }; }
  return { ok: resp.ok, status: resp.status, body: data };
}

// ---- status --------------------------------------------------------------------------------

let statusTimer = null;

function showStatus(s) {
  const el = document.getElementById('status');
  const absent = document.getElementById('absent');
  syncClock(s.now);
  if (s.prefix) document.getElementById('prefix').textContent = s.prefix;
  el.classList.toggle('ok', !!s.loaded);
  el.classList.toggle('bad', !s.loaded);
  if (s.loaded) {
    el.textContent = 'Connected' + (s.server ? ' to ' + s.server : '') + ': library ratelimit ' + (s.version || '') + ' is loaded.';
    absent.hidden = true;
    return true;
  }
  if (s.absent) {
    el.textContent = 'Connected' + (s.server ? ' to ' + s.server : '') + ', but the library is missing.';
    document.getElementById('absent-why').textContent = s.error || '';
    document.getElementById('deploy-command').textContent = s.deploy || 'rlfn deploy';
    absent.hidden = false;
  } else if (s.down) {
    // The playground itself, not the server behind it.
    el.textContent = 'The playground does not answer: is rlfn playground still running? Retrying…';
    absent.hidden = true;
  } else {
    el.textContent = (s.refused ? 'The playground refused the page: ' : 'The server cannot be reached: ') +
      (s.error || 'no answer').replace(/[.?!]*$/, '') + '. Retrying…';
    absent.hidden = true;
  }
  return false;
}

async function checkStatus() {
  const r = await api('/api/status');
  const ok = showStatus(r.ok ? r.body : { error: r.body.error, down: r.down, refused: !r.down });
  // The cards come with the first status that arrives, even a late one.
  if (r.ok && cards.size === 0) for (const info of r.body.cards || []) buildCard(info);
  clearTimeout(statusTimer);
  // Until the cards can work, look again: a deploy in another terminal shows up by itself.
  if (!ok) statusTimer = setTimeout(checkStatus, 3000);
  return r.ok ? r.body : null;
}

// ---- cards ---------------------------------------------------------------------------------

function buildCard(info) {
  const meta = INFO[info.id];
  const node = document.getElementById('card-template').content.firstElementChild.cloneNode(true);
  const id = info.id;
  node.id = 'card-' + id;
  node.dataset.card = id;
  const title = node.querySelector('.card-title');
  title.id = id + '-title';
  title.textContent = meta.title;
  node.setAttribute('aria-labelledby', title.id);
  node.querySelector('.blurb').textContent = meta.blurb;
  node.querySelector('.keyname').textContent = 'key ' + info.key;
  node.querySelector('.timeline').setAttribute('aria-label', meta.title + ': its decisions of the last 10 seconds; the counts above sum them up');
  if (!meta.shaped) node.querySelector('.shaped-only').hidden = true;
  if (!info.penalty) node.querySelector('.blocked-only').hidden = true;

  const fieldBox = node.querySelector('.fields');
  const inputs = {};
  for (const { name, label, min, max } of info.fields) {
    const l = document.createElement('label');
    l.append(label);
    const input = document.createElement('input');
    Object.assign(input, { type: 'number', min, max, step: 1, required: true, name, id: id + '-' + name });
    input.setAttribute('inputmode', 'numeric');
    input.value = info.defaults[name];
    l.append(input);
    fieldBox.append(l);
    inputs[name] = input;
  }
  // The penalty switch: when on, a denial blocks the card's key for the penalty.
  const penaltyBox = node.querySelector('.penalty');
  let penalty = null;
  if (info.penalty) {
    const f = info.penalty;
    const on = penaltyBox.querySelector('.penalty-on');
    Object.assign(on, { id: id + '-penalty', name: 'penalty' });
    const ms = penaltyBox.querySelector('.penalty-ms');
    Object.assign(ms, { id: id + '-penaltyMs', name: f.name, min: f.min, max: f.max, step: 1, value: f.default });
    penaltyBox.querySelector('.penalty-label').textContent = f.label;
    penaltyBox.querySelector('.penalty-key').textContent = 'blocks key ' + f.blockKey;
    penalty = { on, ms, field: f };
    on.addEventListener('change', () => { ms.disabled = !on.checked; });
    ms.disabled = true;
  } else {
    penaltyBox.remove();
  }
  const burstN = node.querySelector('.burst-n');
  burstN.id = id + '-burst-n';
  const burst = node.querySelector('.burst');
  const sync = () => { burst.textContent = 'Burst ' + (burstN.value || '?'); };
  burstN.addEventListener('input', sync);
  sync();
  // Enter in the burst size bursts (in the other fields it submits the form: Send).
  burstN.addEventListener('keydown', (e) => {
    if (e.key === 'Enter') { e.preventDefault(); burst.click(); }
  });
  for (const cls of ['send', 'burst', 'reset']) node.querySelector('.' + cls).id = id + '-' + cls;
  for (const cls of ['admitted-count', 'denied-count', 'shaped-count', 'blocked-count', 'remaining']) node.querySelector('.' + cls).id = id + '-' + cls.replace('-count', '');
  node.querySelector('.error').id = id + '-error';
  node.querySelector('.block').id = id + '-block';
  node.querySelector('.window').id = id + '-window';
  node.querySelector('.last').id = id + '-last';

  const card = {
    id, meta, fields: info.fields, node, inputs, burstN, decisions: [], edge: null, busy: false, inBoundary: false,
    counts: { admitted: 0, denied: 0, shaped: 0, blocked: 0 }, remaining: null, windowMs: info.defaults.windowMs || null,
    penalty, blockedUntil: null,
    // A calendar's window: its anchor (sent with every request) and the end of the window the
    // last decision (or the page's load) was in.
    calendar: info.calendar || null, anchorMs: info.defaults.anchorMs || 0,
    windowEnd: info.calendar ? info.calendar.windowEnd : null,
    svg: node.querySelector('.timeline'),
    error: node.querySelector('.error'),
    last: node.querySelector('.last'),
    block: node.querySelector('.block'),
    window: node.querySelector('.window'),
  };
  if (inputs.windowMs) {
    inputs.windowMs.addEventListener('input', () => {
      const v = Number(inputs.windowMs.value);
      if (Number.isSafeInteger(v) && v > 0) card.windowMs = v;
    });
  }
  node.querySelector('form').addEventListener('submit', (e) => { e.preventDefault(); send(card, 1); });
  burst.addEventListener('click', () => {
    const n = Number(burstN.value);
    if (!Number.isInteger(n) || n < 1 || n > 100) return showError(card, 'The burst size must be a whole number from 1 to 100.');
    send(card, n);
  });
  node.querySelector('.reset').addEventListener('click', () => reset(card));
  document.getElementById('cards').append(node);
  cards.set(id, card);
  tick(card);
  draw(card);
}

// ---- clocks: a block counting down, a calendar window ending -------------------------------

function seconds(ms) {
  return (Math.max(0, ms) / 1000).toFixed(1) + ' s';
}

// utcTime is a server time as a UTC clock reads it: 14:05:00 UTC.
function utcTime(ms) {
  return new Date(ms).toISOString().slice(11, 19) + ' UTC';
}

// tick redraws what counts down: the card's block, and its calendar window.
function tick(card) {
  const now = serverNow();
  if (card.blockedUntil !== null && card.blockedUntil <= now) card.blockedUntil = null;
  const blocked = card.blockedUntil !== null;
  card.block.hidden = !blocked;
  card.node.classList.toggle('is-blocked', blocked);
  if (blocked) card.block.textContent = 'Blocked by the penalty: ' + seconds(card.blockedUntil - now) + ' left (until ' + utcTime(card.blockedUntil) + ')';
  if (!card.calendar) {
    card.window.hidden = true;
    return;
  }
  const end = card.windowEnd;
  if (end === null) {
    card.window.textContent = '';
  } else if (end > now) {
    card.window.textContent = 'This window ends at ' + utcTime(end) + ', in ' + seconds(end - now) + '.';
  } else {
    // A day's windows in UTC are a day long: the next one ends a day after.
    card.window.textContent = 'The window ended at ' + utcTime(end) + ': the next request counts in a new one, ending ' +
      utcTime(end + DAY_MS) + ' tomorrow.';
  }
  card.node.classList.toggle('window-ended', end !== null && end <= now);
}

// params reads a card's form; null (with the card's error shown) when a field is not a whole
// number in range. The server checks everything again: this only saves a round trip.
function params(card) {
  const p = {};
  for (const { name, label, min, max } of card.fields) {
    const v = Number(card.inputs[name].value);
    if (card.inputs[name].value.trim() === '' || !Number.isSafeInteger(v) || v < min || v > max) {
      showError(card, label + ' must be a whole number from ' + min + ' to ' + max + '.');
      card.inputs[name].focus();
      return null;
    }
    p[name] = v;
  }
  if (card.penalty && card.penalty.on.checked) {
    const { ms, field } = card.penalty;
    const v = Number(ms.value);
    if (ms.value.trim() === '' || !Number.isSafeInteger(v) || v < field.min || v > field.max) {
      showError(card, field.label + ' must be a whole number from ' + field.min + ' to ' + field.max + '.');
      ms.focus();
      return null;
    }
    p[field.name] = v;
  }
  if (card.calendar) p.anchorMs = card.anchorMs;
  if (p.windowMs) card.windowMs = p.windowMs;
  return p;
}

// showBusy says why a press does nothing: the card is waiting for the playground. The note
// goes when the wait ends (endBusy).
function showBusy(card, what) {
  showError(card, (card.inBoundary ? 'The boundary scenario is running on this card: ' :
    'A request of this card is running: ') + what + ' when it ends.');
  card.busyNote = true;
}

function endBusy(card) {
  if (card.busyNote) showError(card, '');
}

function showError(card, msg) {
  card.error.textContent = msg;
  card.error.hidden = !msg;
  card.busyNote = false;
}

// handleError shows a failed request on its card. When the server (or the playground) is the
// cause, the status line above is out of date too: look again, and keep looking until the
// cards can work.
function handleError(card, r) {
  showError(card, r.body.error || 'the request failed');
  if (r.down || r.status >= 500) checkStatus();
}

async function send(card, n) {
  if (card.inBoundary) return showBusy(card, 'send');
  // A second Send while one runs is a double press: nothing to say.
  if (card.busy) return;
  const p = params(card);
  if (!p) return;
  card.busy = true;
  card.node.setAttribute('aria-busy', 'true');
  try {
    const r = await api('/api/send', { card: card.id, params: p, n });
    syncClock(r.body.now);
    if (r.body.decisions) addDecisions(card, r.body.decisions);
    if (r.ok) showError(card, ''); else handleError(card, r);
  } finally {
    card.busy = false;
    card.node.removeAttribute('aria-busy');
    endBusy(card);
  }
}

async function reset(card) {
  if (card.inBoundary || card.busy) return showBusy(card, 'reset it');
  card.busy = true;
  try {
    const r = await api('/api/reset', { card: card.id });
    if (!r.ok) return handleError(card, r);
    clearCard(card);
    card.last.textContent = r.body.deleted ? 'Reset: the key was deleted.' : 'Reset: the key was already gone.';
    if (card.penalty) card.last.textContent = r.body.deleted ? 'Reset: the keys (limiter and block) were deleted.' : 'Reset: the keys were already gone.';
  } finally {
    card.busy = false;
    endBusy(card);
  }
}

function clearCard(card) {
  card.decisions = [];
  card.edge = null;
  card.counts = { admitted: 0, denied: 0, shaped: 0, blocked: 0 };
  card.remaining = null;
  card.blockedUntil = null;
  showError(card, '');
  renderCounts(card);
  tick(card);
  draw(card);
}

function addDecisions(card, ds) {
  for (const d of ds) {
    card.decisions.push(d);
    if (!d.allowed) {
      card.counts.denied++;
      if (d.blocked) card.counts.blocked++;
    } else {
      card.counts.admitted++;
      if (d.delayMs > 0) card.counts.shaped++;
    }
    card.remaining = d.remaining;
    // A denial by the block says how long it has left; an admission, that there is none.
    card.blockedUntil = d.blocked ? d.at + d.retryAfterMs : (d.allowed ? null : card.blockedUntil);
    if (d.windowEnd) card.windowEnd = d.windowEnd;
  }
  // Forget what has scrolled off: the longest a mark lives is the span plus its delay.
  const old = serverNow() - SPAN_MS;
  card.decisions = card.decisions.filter((d) => d.at + d.delayMs >= old).slice(-MAX_MARKS);
  if (ds.length) card.last.textContent = describe(ds[ds.length - 1]);
  renderCounts(card);
  tick(card);
  draw(card);
}

function describe(d) {
  if (d.blocked) return 'Last: blocked by the penalty, retry in ' + d.retryAfterMs + ' ms';
  if (!d.allowed) {
    const retry = d.retryAfterMs < 0 ? 'never (more than the limit)' : 'in ' + d.retryAfterMs + ' ms';
    return 'Last: denied, retry ' + retry + ' · reset after ' + d.resetAfterMs + ' ms';
  }
  const delay = d.delayMs > 0 ? ', hold ' + d.delayMs + ' ms before forwarding' : '';
  return 'Last: admitted' + delay + ' · ' + d.remaining + ' of ' + d.limit + ' left · reset after ' + d.resetAfterMs + ' ms';
}

function renderCounts(card) {
  const q = (cls) => card.node.querySelector('.' + cls);
  q('admitted-count').textContent = card.counts.admitted;
  q('denied-count').textContent = card.counts.denied;
  q('shaped-count').textContent = card.counts.shaped;
  q('blocked-count').textContent = card.counts.blocked;
  q('remaining').textContent = card.remaining === null ? '–' : card.remaining;
}

// ---- timeline ------------------------------------------------------------------------------

function el(name, attrs, text) {
  const e = document.createElementNS(SVG_NS, name);
  for (const k in attrs) e.setAttribute(k, attrs[k]);
  if (text !== undefined) e.textContent = text;
  return e;
}

function draw(card) {
  const svg = card.svg;
  const w = Math.max(svg.clientWidth || 0, 200);
  const h = 160;
  svg.setAttribute('viewBox', '0 0 ' + w + ' ' + h);
  svg.replaceChildren();
  const left = 30, right = w - 8, top = 10, plotBottom = 88, lane = 148;
  const now = serverNow();
  const t0 = now - SPAN_MS;
  const x = (t) => left + ((t - t0) / SPAN_MS) * (right - left);

  svg.append(el('line', { x1: left, x2: right, y1: plotBottom, y2: plotBottom, stroke: '#d9dde3' }));
  svg.append(el('line', { x1: left, x2: right, y1: lane + 4, y2: lane + 4, stroke: '#d9dde3' }));
  for (let s = 0; s <= SPAN_MS / 1000; s += 2) {
    const xx = x(now - s * 1000);
    svg.append(el('text', { x: xx, y: h - 1, 'text-anchor': s === 0 ? 'end' : 'middle' }, s === 0 ? 'now' : '−' + s + 's'));
  }
  // Window edges, aligned to the epoch of the server's clock as the library aligns them.
  const wms = card.windowMs;
  if (card.meta.edges && wms && SPAN_MS / wms <= 40) {
    for (let e = Math.ceil(t0 / wms) * wms; e <= now; e += wms) {
      svg.append(el('line', { x1: x(e), x2: x(e), y1: top, y2: lane + 4, stroke: '#8a94a3', 'stroke-dasharray': '3 3' }));
    }
  }
  // A calendar's window end, once it is on screen.
  if (card.windowEnd !== null && card.windowEnd >= t0 && card.windowEnd <= now) {
    const xe = x(card.windowEnd);
    svg.append(el('line', { x1: xe, x2: xe, y1: top, y2: lane + 4, stroke: '#1d232b', 'stroke-width': 1.5 }));
    svg.append(el('text', { x: xe + 3, y: top + 8 }, 'new window'));
  }
  if (card.edge !== null && card.edge >= t0) {
    svg.append(el('line', { x1: x(card.edge), x2: x(card.edge), y1: top, y2: lane + 4, stroke: '#1d232b', 'stroke-width': 1.5, 'stroke-dasharray': '5 2' }));
    svg.append(el('text', { x: x(card.edge) + 3, y: top + 8 }, 'edge'));
  }

  const ds = card.decisions;
  if (!ds.length) {
    svg.append(el('text', { x: (left + right) / 2, y: 55, 'text-anchor': 'middle' }, 'No decision yet: press Send or Burst.'));
    return;
  }
  // remaining as a step line: its value after each decision, until the next one
  const limit = Math.max(1, ds[ds.length - 1].limit);
  const y = (r) => plotBottom - (Math.min(r, limit) / limit) * (plotBottom - top);
  svg.append(el('text', { x: left - 4, y: top + 4, 'text-anchor': 'end' }, String(limit)));
  svg.append(el('text', { x: left - 4, y: plotBottom, 'text-anchor': 'end' }, '0'));
  const xs = (d) => Math.max(left, x(d.at)).toFixed(1);
  let path = 'M' + xs(ds[0]) + ' ' + y(ds[0].remaining).toFixed(1);
  for (let i = 1; i < ds.length; i++) path += ' H' + xs(ds[i]) + ' V' + y(ds[i].remaining).toFixed(1);
  svg.append(el('path', { d: path, fill: 'none', stroke: '#1a73e8', 'stroke-width': 2 }));

  // marks: one per decision, stacked upward where they fall on the same pixels
  const stacks = new Map();
  for (const d of ds) {
    const xd = x(d.at);
    if (xd < left - 4) continue;
    const col = Math.round(xd / 6);
    const n = stacks.get(col) || 0;
    stacks.set(col, n + 1);
    const yd = lane - Math.min(n, 10) * 5.5;
    if (d.blocked) {
      svg.append(el('path', { d: `M${xd - 2.5} ${yd - 2.5}l5 5m0 -5l-5 5`, stroke: '#8430ce', 'stroke-width': 1.8 }));
    } else if (!d.allowed) {
      svg.append(el('path', { d: `M${xd - 2.5} ${yd - 2.5}l5 5m0 -5l-5 5`, stroke: '#d93025', 'stroke-width': 1.8 }));
    } else if (d.delayMs > 0) {
      const xe = Math.min(right, x(d.at + d.delayMs));
      svg.append(el('line', { x1: xd, x2: xe, y1: yd, y2: yd, stroke: '#e37400', 'stroke-width': 1.5 }));
      svg.append(el('line', { x1: xe, x2: xe, y1: yd - 2.5, y2: yd + 2.5, stroke: '#e37400', 'stroke-width': 1.5 }));
      svg.append(el('circle', { cx: xd, cy: yd, r: 2.6, fill: '#e37400' }));
    } else {
      svg.append(el('circle', { cx: xd, cy: yd, r: 2.6, fill: '#1e8e3e' }));
    }
  }
}

// ---- boundary scenario ---------------------------------------------------------------------

async function boundary() {
  const button = document.getElementById('boundary');
  const status = document.getElementById('boundary-status');
  // aria-disabled, not disabled: a disabled button would drop the keyboard's focus.
  if (button.getAttribute('aria-disabled') === 'true') return;
  const ids = ['fixed_window', 'sliding_log', 'sliding_window'];
  const body = {};
  for (const id of ids) {
    const card = cards.get(id);
    if (card.busy) { status.textContent = 'Wait for the ' + INFO[id].title.toLowerCase() + ' card\'s request to end.'; return; }
    const p = params(card);
    if (!p) { status.textContent = 'Fix the ' + INFO[id].title.toLowerCase() + ' card first.'; return; }
    body[id] = p;
  }
  button.setAttribute('aria-disabled', 'true');
  // The three cards are the scenario's until it ends: a Send of their own would change counts
  // the scenario is about to show.
  for (const id of ids) cards.get(id).inBoundary = true;
  status.textContent = 'Waiting for the next edge of the fixed window (at most one window)…';
  try {
    const r = await api('/api/boundary', body);
    if (!r.ok) {
      status.textContent = r.body.error || 'the scenario failed';
      if (r.down || r.status >= 500) checkStatus();
      return;
    }
    syncClock(r.body.now);
    const parts = [];
    for (const id of ids) {
      const card = cards.get(id);
      clearCard(card);
      const ds = r.body.byCard[id] || [];
      card.edge = r.body.edge;
      addDecisions(card, ds);
      const before = ds.filter((d) => d.allowed && d.at < r.body.edge).length;
      const after = ds.filter((d) => d.allowed && d.at >= r.body.edge).length;
      card.last.textContent = 'Boundary: ' + before + ' admitted just before the edge, ' + after + ' just after.';
      parts.push(INFO[id].title.toLowerCase() + ' ' + (before + after));
    }
    status.textContent = 'Admitted around the edge: ' + parts.join(', ') + '.' +
      (r.body.warning ? ' But ' + r.body.warning + '.' : '');
  } finally {
    for (const id of ids) {
      const card = cards.get(id);
      card.inBoundary = false;
      endBusy(card);
    }
    button.removeAttribute('aria-disabled');
  }
}

async function resetAll() {
  for (const card of cards.values()) await reset(card);
}

// ---- start ---------------------------------------------------------------------------------

async function start() {
  await checkStatus();
  document.getElementById('boundary').addEventListener('click', boundary);
  document.getElementById('reset-all').addEventListener('click', resetAll);
  // Redraw so that marks scroll left as server time passes; nothing is drawn in a hidden tab.
  setInterval(() => { if (!document.hidden) for (const c of cards.values()) { tick(c); draw(c); } }, 250);
  window.addEventListener('resize', () => { for (const c of cards.values()) draw(c); });
}

start();
