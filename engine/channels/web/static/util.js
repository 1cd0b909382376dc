// Shared by the pages: building elements (text only, never HTML from data), the API,
// the live feed, and formatting.

const TOKEN_KEY = "ralph-web-token";

// The token comes in the URL `ralph web` printed, in its fragment (#token=...), which is
// never sent to a server (no request line, no log, no Referer); it stays in this tab's
// session storage and goes with every /api request in the X-Ralph-Token header.
function takeToken() {
  const found = location.hash.match(/(?:^#|&)token=([^&]+)/);
  if (found) {
    sessionStorage.setItem(TOKEN_KEY, decodeURIComponent(found[1]));
    history.replaceState(null, "", location.pathname + location.search);
  }
  return sessionStorage.getItem(TOKEN_KEY);
}
export const token = takeToken();
// A token refused (the server was started again, with a new one): said in plain text
export const NO_TOKEN = "This page's token is not the one the server holds: open the address "
  + "ralph web printed when it started (it ends in #token=…). A server started again has a "
  + "new token, unless RALPH_WEB_TOKEN sets it.";

// No token at all: what to open, said once, in place of the page
export function noToken() {
  return h("div", { id: "no-token", class: "card no-token" },
    h("h1", {}, "This page needs its server's token"),
    h("p", {}, "Open the address ", h("code", {}, "ralph web"), " printed when it started: it "
      + "ends in ", h("code", {}, "#token=…"), ". The token stays in this tab; nothing is "
      + "shown without it."),
    h("p", { class: "note" }, "A server started again has a new token, unless ",
      h("code", {}, "RALPH_WEB_TOKEN"), " sets it; then add ", h("code", {}, "#token=…"),
      " with its value to the address yourself."));
}

// The live badge: hidden where there is no feed to follow (no token, or a refused one)
export function hideLive() {
  document.getElementById("live").hidden = true;
}

function headers(extra = {}) {
  return token ? { ...extra, "X-Ralph-Token": token } : extra;
}

// Control and bidi characters (an agent may write them: ESC, U+202E that shows text in
// another order than it was written) are shown as escapes, "\x1b", "\u202e", as the
// terminal views show them (engine/safe_text.py). Newlines and tabs are kept.
const UNSAFE = /[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]/g;

export function printable(text) {
  return String(text).replace(UNSAFE, (c) => {
    const code = c.charCodeAt(0);
    if (c === "\r") return "\\r";
    return code < 0x100 ? `\\x${code.toString(16).padStart(2, "0")}`
      : `\\u${code.toString(16).padStart(4, "0")}`;
  });
}

// Every text and attribute goes through printable: no data reaches the page unescaped.
export function h(tag, props = {}, ...kids) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") el.className = value;
    else if (key === "dataset") Object.assign(el.dataset, value);
    else if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else el.setAttribute(key, value === true ? "" : printable(value));
  }
  for (const kid of kids.flat(Infinity)) {
    if (kid === null || kid === undefined || kid === false) continue;
    el.append(kid instanceof Node ? kid : printable(kid));
  }
  return el;
}

// GET (no body) or a same-origin JSON POST; resolves to {ok, status, data}.
export async function api(path, body) {
  const init = body === undefined
    ? { headers: headers() }
    : { method: "POST", headers: headers({ "Content-Type": "application/json" }),
        body: JSON.stringify(body) };
  let response;
  try {
    response = await fetch(path, init);
  } catch (e) {
    return { ok: false, status: 0, data: { error: `the server cannot be reached (${e.message})` } };
  }
  const text = await response.text();
  let data;
  try {
    data = JSON.parse(text);
  } catch {
    data = { error: text.trim() || response.statusText };
  }
  if (response.status === 401) data = { error: NO_TOKEN };
  return { ok: response.ok, status: response.status, data };
}

function setLive(on, why) {
  const el = document.getElementById("live");
  el.textContent = on ? "live" : "reconnecting…";
  el.title = on ? "following the server's live feed" : (why || "the live feed is down");
  el.classList.toggle("off", !on);
}

// Server-sent events read through fetch rather than EventSource: EventSource sends no
// header, so its token would travel in the URL (kept in logs and history), or need a
// ticket minted per stream (a second secret with a lifetime to manage); fetch sends the
// token as every other /api request does. The feed reconnects after a second whenever
// it breaks (a refused token ends it). Returns a function that stops it.
export function follow(path, handlers) {
  let stopped = false;
  let controller = null;
  async function read() {
    controller = new AbortController();
    const response = await fetch(path, { headers: headers({ Accept: "text/event-stream" }),
                                         signal: controller.signal });
    if (response.status === 401) {   // refused: the page said why; nothing to retry
      stopped = true;
      hideLive();
      return;
    }
    if (!response.ok) throw new Error(`${response.status} ${(await response.text()).trim()}`);
    setLive(true);
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += decoder.decode(value, { stream: true });
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        let event = "message";
        let data = "";
        for (const line of block.split("\n")) {
          if (line.startsWith("event: ")) event = line.slice(7);
          else if (line.startsWith("data: ")) data += line.slice(6);
        }
        if (data && handlers[event]) handlers[event](JSON.parse(data));
      }
    }
  }
  (async () => {
    while (!stopped) {
      try {
        await read();
        setLive(false);
      } catch (e) {
        if (!stopped) setLive(false, e.message);
      }
      if (!stopped) await new Promise((done) => setTimeout(done, 1000));
    }
  })();
  return () => { stopped = true; if (controller) controller.abort(); };
}

export function notice(text, kind = "ok") {
  const el = document.getElementById("notice");
  el.textContent = printable(text);
  el.className = kind;
  el.hidden = false;
  clearTimeout(notice.timer);
  notice.timer = setTimeout(() => { el.hidden = true; }, 8000);
}

export function badge(status) {
  return h("span", { class: `badge ${status}` }, status);
}

export function clock(iso) {
  return iso ? new Date(iso).toLocaleTimeString([], { hour12: false }) : "—";
}

export function ago(iso) {
  if (!iso) return "—";
  const s = Math.max(0, Math.round((Date.now() - new Date(iso).getTime()) / 1000));
  if (s < 60) return `${s}s ago`;
  if (s < 3600) return `${Math.floor(s / 60)}m ago`;
  if (s < 86400) return `${Math.floor(s / 3600)}h ago`;
  return `${Math.floor(s / 86400)}d ago`;
}

export function until(iso) {
  const s = Math.round((new Date(iso).getTime() - Date.now()) / 1000);
  if (s <= 0) return "passed";
  if (s < 60) return `in ${s}s`;
  if (s < 3600) return `in ${Math.floor(s / 60)}m ${s % 60}s`;
  return `in ${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
}

export function money(usage) {
  return usage ? `$${Number(usage.cost_usd || 0).toFixed(2)}` : "—";
}

// Tokens, when the agents report them (metadata.usage input_tokens / output_tokens).
export function tokens(usage) {
  if (!usage || usage.input_tokens === undefined) return "—";
  const n = (x) => Number(x || 0).toLocaleString();
  return `${n(usage.input_tokens)} in / ${n(usage.output_tokens)} out`;
}

export function tasksText(t) {
  if (!t) return "—";
  return `${t.completed} done, ${t.failed} failed, ${t.pending} pending (of ${t.total})`;
}

export function engineOf(v) {
  return v.running ? "running" : (v.status === "active" ? "interrupted" : "—");
}

export function payloadText(e) {
  const p = e.payload;
  if (e.topic === "session.transition" && e.source === "engine" && p && typeof p === "object") {
    return `${p.from} → ${p.to} (${p.trigger}${p.reason ? ": " + p.reason : ""})`;
  }
  if (p === null || p === undefined) return "";
  return typeof p === "string" ? p : JSON.stringify(p);
}
