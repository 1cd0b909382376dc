// The page's router and the sessions list. /s/<ID> is one session (session.js).
import { ago, api, badge, engineOf, follow, h, money, NO_TOKEN, notice, tasksText, token,
         tokens } from "./util.js";
import { sessionPage } from "./session.js";

const COLUMNS = ["session", "waits on you", "status", "state", "engine", "iteration", "tasks",
                 "cost", "tokens", "updated", "paused because"];

function sessionRow(v) {
  const link = h("a", { href: `/s/${encodeURIComponent(v.session_id)}` }, v.session_id);
  if (v.error) {
    return h("tr", { class: "unreadable", dataset: { session: v.session_id } },
      h("td", {}, link), h("td", { colspan: COLUMNS.length - 1 }, `unreadable: ${v.error}`));
  }
  return h("tr", { class: rowClass(v), dataset: { session: v.session_id } },
    h("td", {}, link, h("div", { class: "objective" }, v.objective), place(v)),
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

function detailCells(v) {
  const engine = engineOf(v);
  return [
    humanWait(v),
    h("td", {}, badge(v.status)),
    h("td", { class: "state" }, v.state),
    h("td", { class: `engine ${engine}` }, engine),
    h("td", { class: "num" }, v.iteration),
    h("td", {}, tasksText(v.tasks)),
    h("td", { class: "num" }, money(v.usage)),
    h("td", { class: "num" }, tokens(v.usage)),
    h("td", { title: v.updated_at }, ago(v.updated_at)),
    h("td", { class: "reason" }, v.pause_reason || v.waiting || "")];
}

// A row's first cell (its link) stays the same node while the session is listed in the
// same place: a row rebuilt between a click's press and release would swallow the click.
function refreshRow(tr, v) {
  tr.className = rowClass(v);
  tr.cells[0].querySelector(".objective").textContent = v.objective;
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
  main.replaceChildren(h("p", { class: "error", id: "no-token" }, NO_TOKEN));
} else if (path.startsWith("/s/")) {
  sessionPage(main, decodeURIComponent(path.slice(3)));
} else {
  listPage(main);
}
