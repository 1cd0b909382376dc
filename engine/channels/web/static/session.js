// One session: where it stands, its questions, the controls, the diagram, progress per
// iteration, the live events, its notes and the agents' logs.
import { ago, api, badge, clock, engineOf, follow, h, money, notice, payloadText, printable,
         tasksText, tokens, until } from "./util.js";

const SIGNALS = [
  ["steer", "Steer", "guidance for the next prompt of the chosen role (with 'interrupt': now)"],
  ["info", "Info", "information for the next prompt of the chosen role"],
  ["pause", "Pause", "stop the running agent and pause; resume goes on where it stood"],
  ["abort", "Abort", "stop the running agent and end the session for good"],
];
// shown only while the staged knowledge waits for a decision: they answer nothing else
const KNOWLEDGE_SIGNALS = [
  ["approve", "Approve", "promote the staged knowledge to the docs"],
  ["skip", "Skip", "keep the staged knowledge staged"],
];
const TARGETS = ["ALL", "Planner", "Executor", "Reviewer", "Librarian", "Questioner",
                 "Orchestrator"];
const MARKERS = { " ": "todo", "/": "doing", x: "done", F: "failed", C: "cancelled" };
const MAX_EVENT_ROWS = 2000;

function summaryOf(v) {
  const engine = engineOf(v);
  return [
    h("div", { class: "title" }, h("h1", {}, v.session_id), badge(v.status),
      h("span", { class: "state", id: "state" }, v.state),
      h("span", { class: `engine ${engine}` },
        v.running ? `engine running (pid ${v.engine_pid})`
          : engine === "interrupted" ? "interrupted: no engine runs it" : "")),
    h("p", { class: "objective" }, v.objective),
    v.machine ? h("p", { class: "place" }, `on ${v.machine}, workspace ${v.workspace}`) : null,
    v.pause_reason ? h("p", { class: "pause-reason" }, `Paused: ${v.pause_reason}`) : null,
    v.last_failure ? h("p", { class: "last-failure", id: "last-failure" },
      failureText(v.last_failure)) : null,
    v.waiting ? h("p", { class: "limit-wait", id: "limit-wait" },
      `${v.waiting[0].toUpperCase()}${v.waiting.slice(1)}: the ${v.limit_wait.role}` +
      `${v.limit_wait.task ? " " + v.limit_wait.task : ""} is retried then`) : null,
    h("p", { class: "facts" },
      `iteration ${v.iteration}, batch ${v.batch} · tasks: ${tasksText(v.tasks)}`),
    v.waiting_signals.length
      ? h("p", { class: "waiting" }, `Waiting for the engine: ${v.waiting_signals.join(", ")}`)
      : null,
  ];
}

// a failed agent run as `ralph session status` says it (views.failed_run_text); the
// agent's stderr line is text, never markup
function failureText(f) {
  const who = `the ${f.role}` + (f.task ? ` on ${f.task}` : "");
  const ended = f.timed_out ? "timed out"
    : f.exit_code !== null ? `exited with code ${f.exit_code}` : "ended without an exit code";
  const said = f.stderr_tail ? `its last stderr line: ${f.stderr_tail}`
    : "it wrote nothing on stderr";
  return `Last failed run: ${who} (iteration ${f.iteration}) ${ended}; ${said}; its log: ${f.log}`;
}

function usageOf(v) {
  const u = v.usage;
  const l = v.limits;
  const rows = [
    ["iteration", `${v.iteration} of ${l.max_iterations}`],
    ["runtime", `${Math.round(u.runtime_seconds)} s of ${Math.round(l.max_runtime_seconds)} s`],
    ["cost", money(u) + (l.max_cost_usd === null ? "" : ` of $${l.max_cost_usd.toFixed(2)}`)],
    ["agent runs", u.agent_invocations],
    ["tokens", tokens(u)],
    ["created", `${clock(v.created_at)} (${ago(v.created_at)})`],
    ["updated", `${clock(v.updated_at)} (${ago(v.updated_at)})`],
  ];
  const a = v.assessment;
  return [
    h("h2", {}, "Usage and limits"),
    h("table", { class: "facts" }, h("tbody", {}, rows.map(([k, x]) =>
      h("tr", {}, h("th", {}, k), h("td", {}, x))))),
    h("h2", {}, "Latest assessment"),
    a ? [
      h("p", { id: "confidence" }, `confidence ${(a.confidence * 100).toFixed(0)}% · mode ${a.mode}`
        + (a.fallback_type ? ` · fallback: ${a.fallback_type}` : "") + ` · ${clock(a.at)}`),
      a.triggers.length ? h("ul", { class: "triggers" }, a.triggers.map((t) => h("li", {}, t))) : null,
      h("table", { class: "facts" }, h("tbody", {}, Object.entries(a.factors).map(([k, x]) =>
        h("tr", {}, h("th", {}, k.replaceAll("_", " ")), h("td", {}, Number(x).toFixed(2)))))),
    ] : h("p", { class: "empty" }, "No assessment yet."),
  ];
}

function eventRow(e) {
  const text = payloadText(e);
  return h("tr", { dataset: { seq: e.seq, topic: e.topic } },
    h("td", { class: "num" }, `#${e.seq}`), h("td", {}, clock(e.ts)),
    h("td", {}, e.state || "—"), h("td", {}, e.source), h("td", { class: "topic" }, e.topic),
    h("td", { class: "payload", title: text.length > 300 ? text : null },
      text.length > 300 ? `${text.slice(0, 297)}…` : text));
}

function questionCard(base, q) {
  const result = h("div", { class: "result" });
  const input = h("input", { type: "text", class: "answer-text", placeholder: "Your answer",
                             "aria-label": `answer to ${q.id}` });
  const meta = h("div", { class: "meta" });
  let el;
  const send = async (text) => {
    if (!text.trim()) {
      result.textContent = "Type an answer, or pick one of the options.";
      return;
    }
    el.querySelectorAll("button").forEach((b) => { b.disabled = true; });
    const r = await api(`${base}/questions/${encodeURIComponent(q.id)}/answer`, { text });
    el.querySelectorAll("button").forEach((b) => { b.disabled = false; });
    if (r.ok) {
      el.classList.add("answered");
      result.textContent = printable(`Answered: ${r.data.outcome}`);
      notice(`Answered ${q.id}: ${r.data.outcome}`);
    } else if (r.status === 409 && r.data.answered_by) {
      el.classList.add("late");
      result.textContent = printable(`Already answered (${r.data.answered_by}): ${r.data.answer}`
        + " — your answer changed nothing.");
      notice(`Question ${q.id} was already answered: your answer changed nothing.`, "warn");
    } else {
      result.textContent = printable(r.data.error);
    }
  };
  el = h("article", { class: "question card", dataset: { question: q.id, shownAt: Date.now() } },
    h("h2", {}, "A question for you", q.kind === "fallback" ? " (the agent needs guidance)"
      : q.kind === "approval" ? " (a tool call waits for your approval: allow, deny, or your reason to deny it)"
      : ""),
    meta,
    h("pre", { class: "text" }, q.text),
    q.options.length ? h("div", { class: "options" }, q.options.map((o) =>
      h("button", { type: "button", class: "option", onclick: () => send(o) }, o))) : null,
    h("form", { class: "free", onsubmit: (ev) => { ev.preventDefault(); send(input.value); } },
      input, h("button", { type: "submit" }, "Answer")),
    result);
  const tick = () => meta.replaceChildren(`${q.role || "agent"}${q.task ? ` on ${q.task}` : ""}`
    + ` · asked ${clock(q.asked_at)} · deadline ${clock(q.deadline)} (${until(q.deadline)})`
    + ` · on timeout: ${q.on_timeout}` + (q.default ? ` · default: ${q.default}` : ""));
  tick();
  return { el, tick, update(next) { q = next; tick(); } };
}

function controlsPanel(base) {
  const message = h("textarea", { id: "signal-message", rows: 2,
    placeholder: "A message: guidance for the agents (steer, info) or why (pause, abort)" });
  const target = h("select", { id: "signal-target" }, TARGETS.map((t) => h("option", {}, t)));
  const priority = h("input", { type: "checkbox", id: "signal-priority" });
  const result = h("div", { class: "result", id: "signal-result" });
  const send = async (type) => {
    if (type === "abort" && !window.confirm("Abort this session? It ends for good.")) return;
    const r = await api(`${base}/signals`, { type, message: message.value, target: target.value,
                                             priority: type === "steer" && priority.checked });
    if (r.ok) {
      result.textContent = `${r.data.type} sent (${r.data.signal})`;
      message.value = "";
      notice(`${r.data.type} sent: the engine takes it within a second.`);
    } else {
      result.textContent = printable(r.data.error);
    }
  };
  const button = ([type, label, hint]) => h("button", {
    type: "button", class: `signal ${type}`, dataset: { signal: type }, title: hint,
    onclick: () => send(type) }, label);
  const buttons = SIGNALS.map(button);
  const knowledgeButtons = KNOWLEDGE_SIGNALS.map(button);
  const knowledge = h("div", { class: "knowledge", id: "knowledge-decision", hidden: true },
    h("h3", {}, "The librarian's staged knowledge waits for your decision"),
    h("div", { class: "buttons" }, knowledgeButtons));
  const el = h("section", { id: "controls", class: "card" }, h("h2", {}, "Steer"), message,
    h("div", { class: "row" }, h("label", {}, "to ", target),
      h("label", { title: "steer only: stop the running agent and run its task again now" },
        priority, " interrupt the running agent")),
    h("div", { class: "buttons" }, buttons), knowledge, result);
  return { el, update(v) {
    const open = v.status === "active" || v.status === "paused";
    buttons.forEach((b) => {
      b.disabled = !open || (b.dataset.signal === "pause" && v.status === "paused");
    });
    knowledge.hidden = !open || !(v.state === "KNOWLEDGE_APPROVAL"
      || (v.state === "PAUSED" && v.previous_state === "KNOWLEDGE_APPROVAL"));
  } };
}

function resumePanel(base) {
  const reason = h("p", { class: "reason" });
  const message = h("input", { type: "text", id: "resume-message",
                               placeholder: "A message for the next run (optional)" });
  const limit = (id, label, step) => {
    const input = h("input", { type: "number", id, min: step, step });
    return [input, h("label", {}, label, input)];
  };
  const [iterations, iterationsLabel] = limit("resume-max-iterations", "max iterations ", 1);
  const [runtime, runtimeLabel] = limit("resume-max-runtime", "max runtime (s) ", 1);
  const [cost, costLabel] = limit("resume-max-cost", "max cost ($) ", 0.01);
  const button = h("button", { type: "submit", id: "resume-button" }, "Resume");
  const result = h("div", { class: "result", id: "resume-result" });
  const submit = async (ev) => {
    ev.preventDefault();
    button.disabled = true;
    result.textContent = "Starting the engine…";
    const r = await api(`${base}/resume`, { message: message.value,
      max_iterations: iterations.value || null, max_runtime: runtime.value || null,
      max_cost: cost.value || null });
    button.disabled = false;
    if (r.ok) {
      result.textContent = `Resumed: engine pid ${r.data.pid}`
        + (r.data.exit_code === null ? "" : `, which exited with ${r.data.exit_code}`)
        + ` (its output: ${r.data.log})`;
      message.value = "";
    } else {
      result.textContent = printable(r.data.error);
    }
  };
  const el = h("section", { id: "resume", class: "card", hidden: true },
    h("h2", {}, "Resume"), reason,
    h("form", { onsubmit: submit }, message,
      h("div", { class: "row" }, iterationsLabel, runtimeLabel, costLabel), button),
    result);
  return { el, update(v) {
    el.hidden = v.running || !(v.status === "paused" || v.status === "active");
    reason.textContent = printable(v.status === "paused"
      ? `Paused${v.pause_kind ? ` (${v.pause_kind})` : ""}: ${v.pause_reason || "no reason given"}`
      : "No engine runs this session (it was interrupted): resume it to go on.");
    iterations.placeholder = `now ${v.limits.max_iterations}`;
    runtime.placeholder = `now ${Math.round(v.limits.max_runtime_seconds)}`;
    cost.placeholder = v.limits.max_cost_usd === null ? "none" : `now ${v.limits.max_cost_usd}`;
  } };
}

function iterationBlock(it, open, openLog) {
  const done = it.tasks.filter((t) => t.marker === "x").length;
  return h("details", { class: "iteration", open, dataset: { iteration: it.iteration } },
    h("summary", {}, `Iteration ${it.iteration}`,
      it.started_at ? ` · started ${clock(it.started_at)}` : "",
      it.completed_at ? ` · ended ${clock(it.completed_at)}` : "",
      ` · ${done} of ${it.tasks.length} tasks done`,
      it.knowledge ? ` · knowledge ${it.knowledge}` : ""),
    it.error ? h("p", { class: "error" }, it.error) : null,
    it.tasks.length ? h("table", { class: "tasks" }, h("tbody", {}, it.tasks.map((t) =>
      h("tr", { class: `m-${MARKERS[t.marker] || "other"}`, dataset: { task: t.id } },
        h("td", { class: "marker", title: MARKERS[t.marker] }, `[${t.marker}]`),
        h("td", {}, t.id), h("td", {}, t.title), h("td", {}, `batch ${t.batch}`),
        h("td", { class: "note" }, t.note || ""))))) : h("p", { class: "empty" }, "No tasks planned yet."),
    it.runs.length ? h("ul", { class: "runs" }, it.runs.map((r) => h("li", {},
      h("span", { class: "run" }, r.run),
      r.files.map((f) => h("button", { type: "button", class: "link",
        onclick: () => openLog(it.iteration, f) }, f.slice(r.run.length + 1)))))) : null);
}

export function sessionPage(main, sid) {
  const base = `/api/sessions/${encodeURIComponent(sid)}`;
  document.title = `ralph — ${sid}`;
  document.getElementById("crumbs").replaceChildren(h("a", { href: "/" }, "sessions"), " / ", sid);

  const summary = h("section", { id: "summary", class: "card" });
  const questions = h("section", { id: "questions" });
  const controls = controlsPanel(base);
  const resume = resumePanel(base);
  const usage = h("section", { id: "usage", class: "card" });
  const drawing = h("div", { class: "drawing" }, "Drawing…");
  const legend = h("p", { class: "legend" },
    h("span", { class: "key current" }, "where it stands"),
    h("span", { class: "key visited" }, "visited"),
    h("span", { class: "key taken" }, "→ taken (×N: how many times)"),
    "pause and abort leave any active state; resume returns to the one it paused in");
  const iterations = h("div", { class: "iterations" });
  const logTitle = h("div", { class: "log-title" }, "Pick a run's prompt or output under Progress.");
  const log = h("pre", { class: "log", id: "log", hidden: true });
  const eventRows = h("tbody");
  const eventScroll = h("div", { class: "scroll" }, h("table", { class: "events" }, eventRows));
  const eventCount = h("span", { class: "count" });
  const scratchpad = h("pre", { class: "notes", id: "scratchpad" });
  const guidance = h("ul", { class: "guidance", id: "guidance" });
  main.replaceChildren(summary, questions,
    h("div", { class: "grid" }, h("div", {}, resume.el, controls.el), usage),
    h("section", { id: "diagram", class: "card" }, h("h2", {}, "Where it stands"), drawing,
      legend),
    h("div", { class: "grid" },
      h("section", { id: "progress", class: "card" }, h("h2", {}, "Progress"), iterations),
      h("section", { id: "logs", class: "card" }, h("h2", {}, "Agent logs"), logTitle, log)),
    h("section", { id: "events", class: "card" }, h("h2", {}, "Events ", eventCount), eventScroll),
    h("div", { class: "grid" },
      h("section", { id: "notes", class: "card" }, h("h2", {}, "Scratchpad"), scratchpad),
      h("section", { id: "guidance-card", class: "card" },
        h("h2", {}, "Guidance waiting for a role"), guidance)));

  let view = null;
  let lastSeq = 0;
  const cards = new Map();
  let iterationsKey = null;

  // The picture comes in the snapshot, drawn by the server from the machine's table (no
  // Graphviz, nothing from the network): its state is the header's, always. It holds
  // only state and trigger names, never what an agent wrote.
  function drawDiagram(d) {
    if (drawing.dataset.svg === d.svg) return;
    const svg = new DOMParser().parseFromString(d.svg, "image/svg+xml").documentElement;
    drawing.replaceChildren(document.importNode(svg, true));
    drawing.dataset.svg = d.svg;
    drawing.dataset.state = d.state;
  }

  async function openLog(n, name) {
    logTitle.textContent = `Iteration ${n}: ${name} (loading…)`;
    const r = await api(`${base}/iterations/${n}/logs/${encodeURIComponent(name)}`);
    if (!r.ok) {
      logTitle.textContent = printable(r.data.error);
      return;
    }
    logTitle.textContent = `Iteration ${n}: ${name} (${r.data.size} bytes`
      + `${r.data.truncated ? ", its end shown" : ""})`;
    log.textContent = printable(r.data.text || "(empty)");
    log.hidden = false;
  }

  async function refreshIterations() {
    const key = JSON.stringify([view.iteration, view.usage.agent_invocations, view.current_tasks,
                                view.state]);
    if (key === iterationsKey) return;
    iterationsKey = key;
    const r = await api(`${base}/iterations`);
    if (!r.ok) return;
    const open = new Map([...iterations.querySelectorAll("details")].map((d) =>
      [Number(d.dataset.iteration), d.open]));
    iterations.replaceChildren(...r.data.slice().reverse().map((it) =>
      iterationBlock(it, open.get(it.iteration) ?? it.iteration === view.iteration, openLog)));
  }

  function renderQuestions(v) {
    const pending = new Set(v.pending_questions.map((q) => q.id));
    for (const [id, card] of cards) {
      if (!pending.has(id)) { card.el.remove(); cards.delete(id); }
    }
    for (const q of v.pending_questions) {
      if (cards.has(q.id)) cards.get(q.id).update(q);
      else {
        const card = questionCard(base, q);
        cards.set(q.id, card);
        questions.append(card.el);
      }
    }
  }

  function onSnapshot(snap) {
    view = snap.view;
    const asking = view.pending_questions.length;
    document.title = `${asking ? `(${asking}) ` : ""}ralph — ${sid}`;
    summary.replaceChildren(...summaryOf(view).filter(Boolean));
    renderQuestions(view);
    controls.update(view);
    resume.update(view);
    usage.replaceChildren(...usageOf(view).flat().filter(Boolean));
    scratchpad.textContent = printable(snap.scratchpad || "(empty)");
    guidance.replaceChildren(...(snap.guidance.length ? snap.guidance.map((g) =>
      h("li", {}, `${g.type === "EVENT" ? g.topic : g.type} for ${g.target}`
        + `${g.task ? ` on ${g.task}` : ""}: `
        + (typeof g.message === "string" ? g.message : JSON.stringify(g.message))))
      : [h("li", { class: "empty" }, "none")]));
    drawDiagram(snap.diagram);
    refreshIterations();
  }

  function onEvents(list) {
    const atBottom = eventScroll.scrollTop + eventScroll.clientHeight >= eventScroll.scrollHeight - 8;
    const rows = [];
    for (const e of list) {
      if (e.seq <= lastSeq) continue;   // a record the first batch and the feed both had
      lastSeq = e.seq;
      rows.push(eventRow(e));
    }
    eventRows.append(...rows);
    while (eventRows.rows.length > MAX_EVENT_ROWS) eventRows.deleteRow(0);
    eventCount.textContent = `(${eventRows.rows.length} shown, latest #${lastSeq})`;
    if (atBottom) eventScroll.scrollTop = eventScroll.scrollHeight;
  }

  setInterval(() => cards.forEach((card) => card.tick()), 1000);
  api(base).then((r) => {
    if (!r.ok) {
      main.replaceChildren(h("h1", {}, sid), h("p", { class: "error" }, r.data.error),
                           h("p", {}, h("a", { href: "/" }, "All sessions")));
      return;
    }
    onSnapshot(r.data);
    follow(`${base}/stream`, { snapshot: onSnapshot, events: onEvents,
                               problem: (p) => notice(p.error, "warn") });
  });
}
