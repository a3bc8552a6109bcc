// The demo's UI: chat panel, counter buttons, note list, live log of tool calls (with a
// progress bar and a Stop button while a tool runs), approval cards for destructive tools.
// Everything that comes from the agent or a tool is rendered as text (textContent).
import { start } from "/pedelec/pedelec-pyodide.js";

const $ = (id) => document.getElementById(id);
const status = $("status");
const statusText = $("status-text");
const messages = $("messages");
const input = $("chat-input");
const send = $("chat-send");
const log = $("log");
const notesList = $("notes");
const approvals = $("approvals");
let calls = 0;

const STATE_LABELS = {
  connecting: "Connecting…",
  idle: "Ready",
  running: "Agent working…",
  waiting_tool_result: "Running a tool…",
  closed: "Disconnected",
};
// while a tool call waits for a person, the pill says so rather than "Running a tool…"
const WAITING_LABELS = {
  awaiting_approval: "Waiting for your approval",
  waiting_for_user: "Waiting for you",
};

function showState(state, pending = []) {
  const waiting = state === "waiting_tool_result"
    ? ["awaiting_approval", "waiting_for_user"].find((s) => pending.some((r) => r.status === s))
    : undefined;
  status.dataset.state = waiting ?? state;
  statusText.textContent = waiting ? WAITING_LABELS[waiting] : STATE_LABELS[state] ?? state;
}

// A chat bubble renders at most this much of a message (a pasted megabyte would freeze
// the page's layout); the rest is summed up in a note.
const BUBBLE_CHARS = 4_000;

function setBubbleText(li, text) {
  li.textContent = text.length > BUBBLE_CHARS ? text.slice(0, BUBBLE_CHARS) : text;
  if (text.length > BUBBLE_CHARS) {
    const note = document.createElement("span");
    note.className = "clipped";
    note.textContent = ` … (${text.length.toLocaleString("en")} characters; `
      + `the first ${BUBBLE_CHARS.toLocaleString("en")} are shown)`;
    li.append(note);
  }
}

function addMessage(kind, text) {
  const li = document.createElement("li");
  li.className = `msg ${kind}`;
  setBubbleText(li, text);
  messages.append(li);
  messages.scrollTop = messages.scrollHeight;
  return li;
}

// sendText rejects with `code` and a message for people; a few codes get the demo's words
const PLAIN_ERRORS = {
  FRAME_TOO_LARGE: "This message is too large to send: Core takes messages up to its "
    + "--max-frame-bytes (1 MiB by default). Send a shorter one.",
  RATE_LIMITED: "Too many messages at once: wait a moment and send again.",
};

function plainError(err) {
  return PLAIN_ERRORS[err.code] ?? err.message.trim().split("\n").pop();
}

function compact(value) {
  return JSON.stringify(value, null, 0) ?? "null";
}

/** "3 calls", "1 call, 1 in progress": every row of the log is counted. */
function showCount() {
  const parts = [];
  if (calls) parts.push(`${calls} call${calls === 1 ? "" : "s"}`);
  if (liveRows.size) parts.push(`${liveRows.size} in progress`);
  $("log-count").textContent = parts.join(", ") || "none yet";
}

function logCall(call) {
  calls += 1;
  log.querySelector(".empty")?.remove();
  showCount();
  const row = document.createElement("tr");
  const isError = call.result && typeof call.result === "object" && "error" in call.result;
  row.className = isError ? "error" : "";
  row.dataset.tool = call.tool;
  row.dataset.source = call.source;
  const cells = [
    [new Date().toLocaleTimeString(), ""],
    [call.tool, "tool"],
    [compact(call.args), "code"],
    [compact(call.result), "code result"],
    [null, "tier"],
    [call.durationMs.toFixed(1), "num"],
  ];
  for (const [text, cls] of cells) {
    const td = document.createElement("td");
    td.className = cls === "tier" ? "tier-cell" : cls;
    if (cls === "tier") {
      const badge = document.createElement("span");
      badge.className = `tier ${call.handledBy}`;
      badge.textContent = call.handledBy;
      if (call.handledBy === "none") badge.title = "no handler ran";
      td.append(badge);
      if (call.source === "webmcp") {  // the browser's own agent called it, not Core's
        const source = document.createElement("span");
        source.className = "source webmcp";
        source.textContent = "browser's agent";
        source.title = "called through WebMCP (document.modelContext)";
        td.append(source);
      }
    } else {
      td.textContent = text;
    }
    row.append(td);
  }
  log.prepend(row);
}

function setBusy(busy) {
  input.disabled = busy;
  send.disabled = busy;
  for (const b of document.querySelectorAll("#suggestions button")) b.disabled = busy;
}

function bumpCounter(delta) {
  const out = $("counter-value");
  const value = Number(out.dataset.value) + delta;
  out.dataset.value = String(value);
  out.textContent = String(value);
}

$("counter-inc").addEventListener("click", () => bumpCounter(1));
$("counter-dec").addEventListener("click", () => bumpCounter(-1));
new MutationObserver(() => {
  const out = $("counter-value");
  out.classList.add("bump");
  setTimeout(() => out.classList.remove("bump"), 400);
}).observe($("counter-value"), { childList: true });

// the agent Core runs turns on (`pedelec demo --agent`; served with `--app`, there is no
// /agent.json and the header names none); /call lines are the offline agent's alone
async function showAgent() {
  const answer = await fetch("agent.json");
  if (!answer.ok) return;
  const { kind, label } = await answer.json();
  $("agent-label").textContent = label;
  if (kind === "offline") {
    const code = document.createElement("code");
    code.textContent = "/call TOOL {json}";
    $("chat-hint").replaceChildren("Ask in words, or send ", code, " lines. Try a suggestion:");
  }
}
showAgent().catch(() => {});  // the chat works without it

let pedelec;
try {
  setBusy(true);
  pedelec = await start();
} catch (err) {
  status.dataset.state = "failed";
  statusText.textContent = "Failed to start";
  addMessage("agent failed", err.message);
  throw err;
}
const { session } = pedelec;
const showSessionState = () => showState(session.state, session.pending);
showSessionState();
session.addEventListener("statechange", showSessionState);
session.addEventListener("toolstatus", showSessionState);  // a call began or ended waiting
session.addEventListener("toolcall", (e) => {
  logCall(e.detail);
  renderNotes();  // a note tool may have changed the list
});
status.title = `session ${session.id}`;
// index.html opts in (data-webmcp); the page says whether this browser took the offer
$("webmcp-note").textContent = pedelec.webmcp
  ? "They are offered to this browser's own agent too (WebMCP)."
  : "They would be offered to the browser's own agent too, but this browser has no WebMCP.";

// --- the note list: tools.py keeps it (localStorage); rendered here as text ------------------

let notes = [];

// the delete suggestion names a note that is there (none: it is hidden)
function suggestDelete() {
  const button = $("suggest-delete");
  const first = notes[0];
  button.hidden = first === undefined;
  if (first) {
    button.dataset.text = `Delete note ${JSON.stringify(first.id)}`;
    button.textContent = `Delete note ${first.id}`;
  }
}

async function renderNotes() {
  notes = JSON.parse(await pedelec.runPython("json.dumps(load_notes())"));
  suggestDelete();
  notesList.replaceChildren(...notes.map(({ id, text }) => {
    const li = document.createElement("li");
    li.dataset.id = id;
    const tag = document.createElement("span");
    tag.className = "note-id";
    tag.textContent = id;
    li.append(tag, text);
    return li;
  }));
}

// --- a tool in flight: a live row in the log (status, progress bar, Stop) ---------------------

const LIVE_TEXT = {
  running: "running…",
  awaiting_approval: "waiting for your approval",
  waiting_for_user: "waiting for you",
};
const liveRows = new Map();  // toolRequestId -> {row, bar, text}

function liveRow(toolRequestId, tool) {
  let live = liveRows.get(toolRequestId);
  if (live) return live;
  log.querySelector(".empty")?.remove();
  const row = document.createElement("tr");
  row.className = "live";
  row.dataset.requestId = toolRequestId;
  const cells = [new Date().toLocaleTimeString(), tool, "", "", "", ""].map((text) => {
    const td = document.createElement("td");
    td.textContent = text;
    return td;
  });
  cells[1].className = "tool";
  const bar = document.createElement("progress");  // no value: indeterminate until progress
  bar.setAttribute("aria-label", `Progress of ${tool}`);
  const text = document.createElement("span");
  text.className = "progress-text";
  text.setAttribute("aria-live", "polite");
  cells[3].append(bar, text);
  const stop = document.createElement("button");
  stop.className = "secondary stop";
  stop.textContent = "Stop";
  stop.setAttribute("aria-label", `Stop ${tool}`);
  stop.addEventListener("click", () => {
    stop.disabled = true;
    stop.textContent = "Stopping…";
    session.cancelTool(toolRequestId);  // the handler sees ctx.cancelled
  });
  cells[4].append(stop);
  row.append(...cells);
  log.prepend(row);
  live = { row, bar, text };
  liveRows.set(toolRequestId, live);
  showCount();
  return live;
}

function showProgress(live, { progress, total, message }) {
  if (total) live.bar.max = total;
  live.bar.value = progress;
  live.text.textContent = message ?? (total ? `${progress} of ${total}` : String(progress));
}

function showStatus({ toolRequestId, tool, status, progress }) {
  if (status === "done") {  // its toolcall event (the finished row) follows
    liveRows.get(toolRequestId)?.row.remove();
    liveRows.delete(toolRequestId);
    removeCard(toolRequestId);  // answered some other way: cancelled, timed out
    showCount();
    return;
  }
  const live = liveRow(toolRequestId, tool);
  live.bar.hidden = status !== "running";  // a person decides: nothing is being worked on
  if (progress) showProgress(live, progress);
  else live.text.textContent = LIVE_TEXT[status] ?? status;
}

session.addEventListener("toolstatus", (e) => showStatus(e.detail));
session.addEventListener("toolprogress", (e) => showProgress(liveRow(e.detail.toolRequestId, e.detail.tool), e.detail));

// --- approval cards: a tool that needs approval asks here (again after a reload) --------------

const cards = new Map();  // toolRequestId -> card
let cardNumber = 0;

function removeCard(toolRequestId) {
  cards.get(toolRequestId)?.remove();
  cards.delete(toolRequestId);
}

function describe(tool, args) {
  const note = tool === "delete_note" ? notes.find((n) => n.id === args?.id) : undefined;
  return note ? `Deletes note ${note.id}: “${note.text}”` : `${tool} ${compact(args)}`;
}

function showApproval(event) {
  const { toolRequestId, tool, args } = event.detail;
  removeCard(toolRequestId);
  cardNumber += 1;
  const card = document.createElement("div");
  card.className = "approval";
  card.dataset.requestId = toolRequestId;
  card.setAttribute("role", "alertdialog");
  card.setAttribute("aria-labelledby", `approval-title-${cardNumber}`);
  card.setAttribute("aria-describedby", `approval-body-${cardNumber}`);
  card.tabIndex = -1;
  const title = document.createElement("h3");
  title.id = `approval-title-${cardNumber}`;
  title.textContent = `Allow ${tool}?`;
  const body = document.createElement("p");
  body.id = `approval-body-${cardNumber}`;
  body.style.margin = "0";
  body.textContent = describe(tool, args);
  const argsLine = document.createElement("div");
  argsLine.className = "args";
  argsLine.textContent = compact(args);
  const actions = document.createElement("div");
  actions.className = "actions";
  const approve = document.createElement("button");
  approve.className = "primary";
  approve.textContent = "Approve";
  const deny = document.createElement("button");
  deny.className = "secondary";
  deny.textContent = "Deny";
  approve.addEventListener("click", () => { event.approve(); removeCard(toolRequestId); });
  deny.addEventListener("click", () => { event.deny("the user said no"); removeCard(toolRequestId); });
  actions.append(approve, deny);
  card.append(title, body, argsLine, actions);
  approvals.append(card);
  cards.set(toolRequestId, card);
  card.focus();  // announced; a stray Enter does not approve
}

session.addEventListener("approval", showApproval);
for (const request of session.pending) showStatus(request);  // after a reload
await renderNotes();
setBusy(false);

let streaming = null;
session.addEventListener("delta", (e) => {
  if (streaming && streaming.textContent.length < BUBBLE_CHARS) {
    streaming.textContent += e.detail.text;  // the full reply replaces it, clipped, at the end
    messages.scrollTop = messages.scrollHeight;
  }
});

async function ask(text) {
  if (!text.trim()) return;
  addMessage("user", text);
  streaming = addMessage("agent pending", "");
  setBusy(true);
  try {
    const reply = await session.sendText(text);
    setBubbleText(streaming, reply);
  } catch (err) {
    streaming.classList.add("failed");
    setBubbleText(streaming, plainError(err));
  } finally {
    streaming.classList.remove("pending");
    streaming = null;
    setBusy(false);
    input.focus();
  }
}

$("chat-form").addEventListener("submit", (e) => {
  e.preventDefault();
  const text = input.value;
  input.value = "";
  input.style.height = "auto";
  ask(text);
});
input.addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey) {
    e.preventDefault();
    $("chat-form").requestSubmit();
  }
});
input.addEventListener("input", () => {
  input.style.height = "auto";
  input.style.height = `${input.scrollHeight}px`;
});
for (const button of document.querySelectorAll("#suggestions button")) {
  button.addEventListener("mousedown", (e) => e.preventDefault()); // keep the editor's selection
  button.addEventListener("click", () => ask(button.dataset.text));
}
