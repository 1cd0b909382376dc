// The page's router and the sessions list. /s/<ID> is one session (session.js).
import { ago, api, badge, engineOf, follow, h, hideLive, money, notice, noToken, printable,
         tasksText, token, tokens } from "./util.js";
import { sessionPage } from "./session.js";

const COLUMNS = ["session", "waits on you", "status", "state", "iteration", "tasks", "usage",
                 "updated", "paused because"];

// A row is named by its objective (what the session is for); its id is the small print
function sessionRow(v) {
  const href = `/s/${encodeURIComponent(v.session_id)}`;
  if (v.error) {
    return h("tr", { class: "unreadable", dataset: { session: v.session_id } },
      h("td", { class: "session" }, h("a", { href }, v.session_id)),
      h("td", { colspan: COLUMNS.length - 1 }, `unreadable: ${v.error}`));
  }
  return h("tr", { class: rowClass(v), dataset: { session: v.session_id } },
    h("td", { class: "session" },
      h("a", { href, class: "objective", title: v.objective }, v.objective || v.session_id),
      h("div", { class: "sid" }, v.session_id), place(v)),
    ...detailCells(v));
}

// On a fleet's store: the machine and workspace a session runs in (where to resume it)
function place(v) {
  return v.machine ? h("div", { class: "place" }, `${v.machine}:${v.workspace}`) : null;
}

function rowClass(v) {
  return `status-${v.status}${v.questions_pending ? " waits-on-human" : ""}`;
}

// "2 questions · oldest 5m ago": how long a human has kept the session waiting
function humanWait(v) {
  const n = v.questions_pending;
  if (!n) return h("td", { class: "human-wait" });
  return h("td", { class: "human-wait" },
    h("span", { class: "asks" }, `${n} question${n > 1 ? "s" : ""}`),
    h("div", { class: "since", dataset: { since: v.oldest_question_asked_at } },
      `oldest ${ago(v.oldest_question_asked_at)}`));
}

// EXECUTING_BATCH may wrap after its underscore, not inside a word
function breakable(name) {
  return String(name).split("_").flatMap((part, i) => (i ? ["_", h("wbr"), part] : [part]));
}

// "2 of 5 done, 1 failed": the list's short form (the session's page says it all)
function tasksShort(t) {
  if (!t) return "—";
  return `${t.completed} of ${t.total} done${t.failed ? `, ${t.failed} failed` : ""}`;
}

function detailCells(v) {
  const engine = engineOf(v);
  return [
    humanWait(v),
    h("td", {}, badge(v.status), h("div", { class: `engine ${engine}` }, engine)),
    h("td", { class: "state" }, breakable(v.state)),
    h("td", { class: "num" }, v.iteration),
    h("td", { class: "tasks", title: tasksText(v.tasks) }, tasksShort(v.tasks)),
    h("td", { class: "usage" }, money(v.usage), h("div", { class: "tokens" }, tokens(v.usage))),
    h("td", { title: v.updated_at }, ago(v.updated_at)),
    h("td", { class: "reason" }, v.pause_reason || v.waiting || "")];
}

// A row's first cell (its link) stays the same node while the session is listed in the
// same place: a row rebuilt between a click's press and release would swallow the click.
function refreshRow(tr, v) {
  tr.className = rowClass(v);
  const objective = tr.cells[0].querySelector(".objective");
  objective.textContent = printable(v.objective || v.session_id);
  objective.title = printable(v.objective);
  while (tr.cells.length > 1) tr.deleteCell(-1);
  tr.append(...detailCells(v));
}

// The tab says how many sessions wait on a human, so a tab in the background still tells.
function countInTitle(list) {
  const waiting = list.filter((v) => v.questions_pending).length;
  document.title = `${waiting ? `(${waiting}) ` : ""}ralph — sessions`;
}

function listPage(main) {
  document.title = "ralph — sessions";
  const rows = h("tbody");
  const table = h("table", { class: "sessions", id: "sessions", hidden: true },
    h("thead", {}, h("tr", {}, COLUMNS.map((c) => h("th", {}, c)))), rows);
  const empty = h("p", { class: "empty", hidden: true },
    "No session in this workspace yet: ralph session start \"OBJECTIVE\" starts one.");
  main.replaceChildren(h("h1", {}, "Sessions"), table, empty);
  const render = (list) => {
    const shown = [...rows.rows];
    const inPlace = shown.length === list.length && list.every((v, i) => !v.error
      && shown[i].dataset.session === v.session_id && !shown[i].classList.contains("unreadable"));
    if (inPlace) list.forEach((v, i) => refreshRow(shown[i], v));
    else rows.replaceChildren(...list.map(sessionRow));
    table.hidden = list.length === 0;
    empty.hidden = list.length > 0;
    countInTitle(list);
  };
  // the feed speaks on changes only: the waits' ages are kept current here
  setInterval(() => rows.querySelectorAll("[data-since]").forEach((el) => {
    el.textContent = `oldest ${ago(el.dataset.since)}`;
  }), 10000);
  api("/api/sessions").then((r) => {
    if (r.ok) render(r.data);
    else main.append(h("p", { class: "error" }, r.data.error));
  });
  follow("/api/stream", { sessions: render, problem: (p) => notice(p.error, "warn") });
}

const main = document.getElementById("main");
const path = location.pathname;
if (!token) {
  hideLive();
  main.replaceChildren(noToken());
} else if (path.startsWith("/s/")) {
  sessionPage(main, decodeURIComponent(path.slice(3)));
} else {
  listPage(main);
}
