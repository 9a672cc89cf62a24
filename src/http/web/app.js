// The chat page of `coli serve --http` (served from the binary by
// src/http/web.rs). Plain script, no dependencies: it talks to this
// server's /v1/models and /v1/chat/completions (streamed) and keeps
// conversations and settings in localStorage.
//
// Model text is never parsed as HTML: the markdown renderer below builds
// DOM nodes and puts text in with text nodes only.
//
// Stable hooks (tests/web_page.rs and anyone scripting the page use them):
//   body[data-busy]        "true" while a reply streams, else "false"
//   #model-name            the served model's id; [data-state] loading | ready | error
//   #notice                the latest problem, empty when there is none
//   #conversations > li    one per conversation, newest first: [data-id], and
//                          [aria-current="true"] on the open one; inside it
//                          .conv-title (opens it) and .conv-delete (deletes it)
//   #new-chat #input #send #stop
//   #api-key #system-prompt #max-tokens #temperature #seed
//                          settings, saved as they change (empty: server's default)
//   #messages > .msg       [data-role] user | assistant; an assistant message has
//                          [data-status] streaming | done | stopped | error, and
//                          .msg-body (the answer), details.reasoning, .tool-calls,
//                          .msg-error, .msg-meta with [data-completion-tokens],
//                          [data-cached-tokens] and [data-tok-per-s] when known
"use strict";

const KEYS = {
  conversations: "colibri.conversations",
  active: "colibri.active",
  settings: "colibri.settings",
};
// How often a streaming reply is written to localStorage (ms): a reload
// mid-reply keeps the text so far.
const SAVE_EVERY_MS = 1000;
// How often a streaming reply is redrawn (ms): chunks in between are batched.
const DRAW_EVERY_MS = 40;

const $ = (id) => document.getElementById(id);

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

// ---- storage -------------------------------------------------------------

function load(key, fallback) {
  try {
    const v = localStorage.getItem(key);
    return v === null ? fallback : JSON.parse(v);
  } catch (_) {
    return fallback;
  }
}

function store(key, value) {
  try {
    localStorage.setItem(key, JSON.stringify(value));
  } catch (e) {
    notice("This browser did not save the conversations: " + e.message);
  }
}

function str(v) {
  return typeof v === "string" ? v : "";
}

// What localStorage held, checked field by field (it may be from an older
// page or edited by hand).
function loadConversations() {
  const raw = load(KEYS.conversations, []);
  if (!Array.isArray(raw)) return [];
  const out = [];
  for (const c of raw) {
    if (!c || typeof c.id !== "string" || !Array.isArray(c.messages)) continue;
    const messages = [];
    for (const m of c.messages) {
      if (!m || (m.role !== "user" && m.role !== "assistant")) continue;
      const msg = { role: m.role, content: str(m.content) };
      if (m.role === "assistant") {
        msg.reasoning = str(m.reasoning);
        msg.toolCalls = Array.isArray(m.toolCalls) ? m.toolCalls : [];
        // A reply that was streaming when the page went away stopped there.
        msg.status = ["done", "stopped", "error"].includes(m.status) ? m.status : "stopped";
        msg.error = str(m.error);
        msg.stats = m.stats && typeof m.stats === "object" ? m.stats : {};
      }
      messages.push(msg);
    }
    out.push({
      id: c.id,
      title: str(c.title),
      updated: Number(c.updated) || 0,
      messages,
    });
  }
  return out;
}

const state = {
  conversations: loadConversations(),
  activeId: load(KEYS.active, null),
  settings: Object.assign(
    { apiKey: "", system: "", maxTokens: "", temperature: "", seed: "" },
    load(KEYS.settings, {}),
  ),
  model: null,
  // The reply being streamed: { controller, conv, msg }.
  stream: null,
  lastSave: 0,
  drawTimer: null,
  // Message object -> its element in #messages (only the open conversation's).
  shown: new Map(),
};

function saveConversations() {
  state.lastSave = Date.now();
  store(KEYS.conversations, state.conversations);
  store(KEYS.active, state.activeId);
}

// ---- small helpers -------------------------------------------------------

function notice(text) {
  $("notice").textContent = text || "";
}

function newId() {
  return Date.now().toString(36) + Math.random().toString(36).slice(2, 8);
}

function authHeaders() {
  const h = {};
  const key = state.settings.apiKey.trim();
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}

function activeConversation() {
  return state.conversations.find((c) => c.id === state.activeId) || null;
}

function titleOf(text) {
  const t = text.replace(/\s+/g, " ").trim();
  return t.length > 48 ? t.slice(0, 47) + "…" : t;
}

// The error message of a failed response, in OpenAI's shape or as text.
async function errorText(res) {
  const body = await res.text().catch(() => "");
  try {
    const v = JSON.parse(body);
    if (v && v.error && v.error.message) return v.error.message + " (HTTP " + res.status + ")";
  } catch (_) {
    // not JSON: the text itself
  }
  return (body.trim() || res.statusText || "request failed") + " (HTTP " + res.status + ")";
}

// ---- the model -----------------------------------------------------------

async function fetchModel() {
  const name = $("model-name");
  name.dataset.state = "loading";
  try {
    const res = await fetch("/v1/models", { headers: authHeaders() });
    if (!res.ok) {
      state.model = null;
      name.dataset.state = "error";
      name.textContent = res.status === 401 ? "API key needed (Settings)" : "no model";
      if (res.status === 401) $("settings").open = true;
      notice(await errorText(res));
      return;
    }
    const v = await res.json();
    const id = v && Array.isArray(v.data) && v.data[0] && v.data[0].id;
    state.model = typeof id === "string" ? id : null;
    name.textContent = state.model || "unknown model";
    name.dataset.state = state.model ? "ready" : "error";
    notice("");
    if (!activeConversation() || activeConversation().messages.length === 0) drawMessages();
  } catch (e) {
    state.model = null;
    name.dataset.state = "error";
    name.textContent = "server unreachable";
    notice(e.message);
  }
}

// ---- markdown ------------------------------------------------------------

const LIST_ITEM = /^( {0,12})([-*+]|\d{1,9}[.)])[ \t]+(.*)$/;
const FENCE = /^ {0,3}(`{3,}|~{3,})\s*([^`\s]*)/;
const ESCAPABLE = "\\`*_~[]()#+-.!>|{}";

function lead(line) {
  return line.length - line.trimStart().length;
}

function isBlank(line) {
  return line.trim() === "";
}

// Whether `line` starts a block other than a paragraph.
function startsBlock(line) {
  return (
    FENCE.test(line) ||
    /^ {0,3}#{1,6}\s/.test(line) ||
    /^ {0,3}>/.test(line) ||
    /^ {0,3}([-*_])(\s*\1){2,}\s*$/.test(line) ||
    LIST_ITEM.test(line)
  );
}

function tableCells(line) {
  let t = line.trim();
  if (t.startsWith("|")) t = t.slice(1);
  if (t.endsWith("|") && !t.endsWith("\\|")) t = t.slice(0, -1);
  return t.split(/(?<!\\)\|/).map((c) => c.trim().replace(/\\\|/g, "|"));
}

function isTableRule(line) {
  return /^\s*\|?\s*:?-{2,}:?\s*(\|\s*:?-{2,}:?\s*)*\|?\s*$/.test(line) && line.includes("-");
}

// Markdown `src` as DOM nodes appended to `parent`: paragraphs, headings,
// fenced code, lists, quotes, rules, pipe tables; inline code, emphasis,
// strike-through, links (http, https, mailto only).
function renderMarkdown(src, parent) {
  const lines = src.replace(/\r\n?/g, "\n").split("\n");
  let para = [];
  const flush = () => {
    if (para.length === 0) return;
    const p = el("p");
    para.forEach((l, k) => {
      if (k > 0) p.append(el("br"));
      inline(l.trim(), p);
    });
    parent.append(p);
    para = [];
  };
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    const fence = FENCE.exec(line);
    if (fence) {
      flush();
      const close = new RegExp("^ {0,3}" + (fence[1][0] === "`" ? "`" : "~") + "{" + fence[1].length + ",}\\s*$");
      const body = [];
      i++;
      while (i < lines.length && !close.test(lines[i])) body.push(lines[i++]);
      i++;
      parent.append(codeBlock(body.join("\n"), fence[2]));
      continue;
    }
    if (isBlank(line)) {
      flush();
      i++;
      continue;
    }
    const h = /^ {0,3}(#{1,6})\s+(.*?)(\s+#+)?\s*$/.exec(line);
    if (h) {
      flush();
      const e = el("h" + h[1].length);
      inline(h[2], e);
      parent.append(e);
      i++;
      continue;
    }
    if (/^ {0,3}([-*_])(\s*\1){2,}\s*$/.test(line)) {
      flush();
      parent.append(el("hr"));
      i++;
      continue;
    }
    if (/^ {0,3}>/.test(line)) {
      flush();
      const quoted = [];
      while (i < lines.length && /^ {0,3}>/.test(lines[i])) quoted.push(lines[i++].replace(/^ {0,3}> ?/, ""));
      const q = el("blockquote");
      renderMarkdown(quoted.join("\n"), q);
      parent.append(q);
      continue;
    }
    if (LIST_ITEM.test(line)) {
      flush();
      i = renderList(lines, i, parent);
      continue;
    }
    if (line.includes("|") && i + 1 < lines.length && isTableRule(lines[i + 1])) {
      flush();
      i = renderTable(lines, i, parent);
      continue;
    }
    para.push(line);
    i++;
  }
  flush();
}

function renderList(lines, i, parent) {
  const first = LIST_ITEM.exec(lines[i]);
  const indent = first[1].length;
  const ordered = /\d/.test(first[2]);
  const sameKind = (m) => m && m[1].length === indent && /\d/.test(m[2]) === ordered;
  const list = el(ordered ? "ol" : "ul");
  if (ordered && parseInt(first[2], 10) !== 1) list.start = parseInt(first[2], 10);
  while (i < lines.length) {
    const m = LIST_ITEM.exec(lines[i]);
    if (!sameKind(m)) break;
    const cut = new RegExp("^ {0," + (indent + m[2].length + 1) + "}");
    const body = [m[3]];
    i++;
    while (i < lines.length) {
      const l = lines[i];
      if (isBlank(l)) {
        let j = i + 1;
        while (j < lines.length && isBlank(lines[j])) j++;
        if (j < lines.length && lead(lines[j]) > indent && !sameKind(LIST_ITEM.exec(lines[j]))) {
          for (; i < j; i++) body.push("");
          continue;
        }
        if (j < lines.length && sameKind(LIST_ITEM.exec(lines[j]))) i = j;
        break;
      }
      if (lead(l) <= indent && startsBlock(l)) break;
      body.push(lead(l) > indent ? l.replace(cut, "") : l.trimStart());
      i++;
    }
    const item = el("li");
    renderMarkdown(body.join("\n"), item);
    list.append(item);
    if (i < lines.length && isBlank(lines[i])) break;
  }
  parent.append(list);
  return i;
}

function renderTable(lines, i, parent) {
  const head = tableCells(lines[i]);
  const aligns = tableCells(lines[i + 1]).map((c) =>
    c.startsWith(":") && c.endsWith(":") ? "center" : c.endsWith(":") ? "right" : "",
  );
  const table = el("table");
  const row = (cells, tag) => {
    const tr = el("tr");
    head.forEach((_, k) => {
      const td = el(tag);
      if (aligns[k]) td.classList.add("align-" + aligns[k]);
      inline(cells[k] || "", td);
      tr.append(td);
    });
    return tr;
  };
  const thead = el("thead");
  thead.append(row(head, "th"));
  const tbody = el("tbody");
  i += 2;
  while (i < lines.length && lines[i].includes("|") && !isBlank(lines[i])) tbody.append(row(tableCells(lines[i++]), "td"));
  table.append(thead, tbody);
  const wrap = el("div", "table-wrap");
  wrap.append(table);
  parent.append(wrap);
  return i;
}

function codeBlock(text, lang) {
  const wrap = el("div", "code");
  const bar = el("div", "code-bar");
  bar.append(el("span", "code-lang", lang || "text"));
  if (navigator.clipboard) {
    const copy = el("button", "code-copy", "copy");
    copy.type = "button";
    copy.addEventListener("click", () => {
      navigator.clipboard.writeText(text).then(
        () => (copy.textContent = "copied"),
        () => (copy.textContent = "copy failed"),
      );
    });
    bar.append(copy);
  }
  const pre = el("pre");
  const code = el("code", null, text);
  if (lang) code.dataset.lang = lang;
  pre.append(code);
  wrap.append(bar, pre);
  return wrap;
}

// Where emphasis that opens at `i` closes: { tag, inner, end } or null.
function emphasis(s, i) {
  const word = /[\p{L}\p{N}]/u;
  for (const [mark, tag] of [["**", "strong"], ["__", "strong"], ["~~", "del"], ["*", "em"], ["_", "em"]]) {
    if (!s.startsWith(mark, i)) continue;
    const after = s[i + mark.length];
    if (after === undefined || /\s/.test(after)) continue;
    if (mark[0] === "_" && i > 0 && word.test(s[i - 1])) continue;
    let from = i + mark.length + 1;
    for (;;) {
      const end = s.indexOf(mark, from);
      if (end < 0) break;
      from = end + 1;
      if (/\s/.test(s[end - 1])) continue;
      if (mark.length === 1 && (s[end - 1] === mark || s[end + 1] === mark)) continue;
      if (mark[0] === "_" && word.test(s[end + mark.length] || "")) continue;
      return { tag, inner: s.slice(i + mark.length, end), end: end + mark.length };
    }
  }
  return null;
}

function link(href, label) {
  const a = el("a");
  a.href = href;
  a.target = "_blank";
  a.rel = "noopener noreferrer";
  a.append(label);
  return a;
}

// One line of inline markdown appended to `parent` as nodes.
function inline(s, parent) {
  let text = "";
  const flush = () => {
    if (text) parent.append(document.createTextNode(text));
    text = "";
  };
  let i = 0;
  while (i < s.length) {
    const c = s[i];
    if (c === "\\" && i + 1 < s.length && ESCAPABLE.includes(s[i + 1])) {
      text += s[i + 1];
      i += 2;
      continue;
    }
    if (c === "`") {
      let n = 1;
      while (s[i + n] === "`") n++;
      const fence = "`".repeat(n);
      let end = s.indexOf(fence, i + n);
      while (end >= 0 && s[end + n] === "`") end = s.indexOf(fence, end + n + 1);
      if (end >= 0) {
        flush();
        let code = s.slice(i + n, end);
        if (code.length > 2 && code.startsWith(" ") && code.endsWith(" ")) code = code.slice(1, -1);
        parent.append(el("code", null, code));
        i = end + n;
        continue;
      }
      text += fence;
      i += n;
      continue;
    }
    if (c === "[") {
      const m = /^\[([^\]\n]*)\]\(\s*<?([^\s()<>]+)>?(?:\s+"[^"]*")?\s*\)/.exec(s.slice(i));
      if (m) {
        flush();
        if (/^(https?:|mailto:)/i.test(m[2])) {
          const label = document.createDocumentFragment();
          inline(m[1], label);
          parent.append(link(m[2], label));
        } else {
          inline(m[1], parent);
        }
        i += m[0].length;
        continue;
      }
    }
    if (c === "h" && (i === 0 || !/[\p{L}\p{N}]/u.test(s[i - 1]))) {
      const m = /^https?:\/\/[^\s<>"]*[^\s<>".,:;!?')\]]/.exec(s.slice(i));
      if (m) {
        flush();
        parent.append(link(m[0], m[0]));
        i += m[0].length;
        continue;
      }
    }
    const em = emphasis(s, i);
    if (em) {
      flush();
      const e = el(em.tag);
      inline(em.inner, e);
      parent.append(e);
      i = em.end;
      continue;
    }
    text += c;
    i++;
  }
  flush();
}

// Reasoning the model wrote inline: `<think>…</think>` at the start (or a
// closing tag only, when the chat template opened the block in the prompt).
function splitThink(text) {
  const open = text.indexOf("<think>");
  const close = text.indexOf("</think>");
  if (close >= 0 && (open < 0 || open < close) && (open < 0 || isBlank(text.slice(0, open)))) {
    const start = open >= 0 ? open + "<think>".length : 0;
    return { thought: text.slice(start, close), answer: text.slice(close + "</think>".length), thinking: false };
  }
  if (open >= 0 && isBlank(text.slice(0, open))) {
    return { thought: text.slice(open + "<think>".length), answer: "", thinking: true };
  }
  return { thought: "", answer: text, thinking: false };
}

// ---- drawing -------------------------------------------------------------

function drawList() {
  const ul = $("conversations");
  ul.replaceChildren();
  const sorted = [...state.conversations].sort((a, b) => b.updated - a.updated);
  for (const c of sorted) {
    const li = el("li");
    li.dataset.id = c.id;
    if (c.id === state.activeId) li.setAttribute("aria-current", "true");
    const open = el("button", "conv-title", c.title || "New chat");
    open.type = "button";
    open.title = c.title || "New chat";
    open.addEventListener("click", () => openConversation(c.id));
    const del = el("button", "conv-delete", "×");
    del.type = "button";
    del.title = "Delete this conversation";
    del.setAttribute("aria-label", "Delete conversation " + (c.title || "New chat"));
    del.addEventListener("click", () => deleteConversation(c.id));
    li.append(open, del);
    ul.append(li);
  }
}

function drawMessages() {
  const box = $("messages");
  box.replaceChildren();
  state.shown = new Map();
  const conv = activeConversation();
  if (!conv || conv.messages.length === 0) {
    const hint = el("div", "empty");
    hint.append(el("div", "empty-title", state.model || "colibri"));
    hint.append(el("div", null, "Type a message below to start."));
    box.append(hint);
    return;
  }
  for (const m of conv.messages) {
    const e = el("div", "msg");
    e.dataset.role = m.role;
    box.append(e);
    state.shown.set(m, e);
    fillMessage(m, e);
  }
  box.scrollTop = box.scrollHeight;
}

function fillMessage(m, e) {
  if (m.role === "user") {
    e.replaceChildren(el("div", "msg-body", m.content));
    return;
  }
  e.dataset.status = m.status;
  const wasOpen = e.querySelector("details.reasoning")?.open;
  const parts = splitThink(m.content);
  const thought = [m.reasoning, parts.thought].filter((t) => t && t.trim()).join("\n\n");
  const nodes = [];
  if (thought) {
    const d = el("details", "reasoning");
    d.open = wasOpen ?? false;
    const thinking = m.status === "streaming" && (parts.thinking || (!parts.answer && !m.content));
    d.append(el("summary", null, thinking ? "Reasoning…" : "Reasoning"));
    const inner = el("div", "reasoning-body");
    renderMarkdown(thought, inner);
    d.append(inner);
    nodes.push(d);
  }
  const body = el("div", "msg-body");
  renderMarkdown(parts.answer, body);
  if (m.status === "streaming") {
    const last = body.lastElementChild;
    (last && last.tagName === "P" ? last : body).append(el("span", "cursor"));
  }
  nodes.push(body);
  if (m.toolCalls.length > 0) {
    const calls = el("div", "tool-calls");
    for (const t of m.toolCalls) {
      const call = el("div", "tool-call");
      call.append(el("div", "tool-name", "tool call: " + (t.name || "?")));
      let args = t.arguments || "";
      try {
        args = JSON.stringify(JSON.parse(args), null, 2);
      } catch (_) {
        // still streaming, or not JSON: shown as it came
      }
      call.append(el("pre", null, args));
      calls.append(call);
    }
    nodes.push(calls);
  }
  if (m.error) nodes.push(el("div", "msg-error", m.error));
  nodes.push(metaLine(m));
  e.replaceChildren(...nodes);
}

function metaLine(m) {
  const meta = el("div", "msg-meta");
  const s = m.stats || {};
  const bits = [];
  if (Number.isFinite(s.completionTokens)) {
    meta.dataset.completionTokens = String(s.completionTokens);
    bits.push(s.completionTokens + " tokens");
  }
  if (Number.isFinite(s.tokPerS)) {
    meta.dataset.tokPerS = s.tokPerS.toFixed(1);
    bits.push(s.tokPerS.toFixed(1) + " tok/s");
  }
  if (Number.isFinite(s.firstTokenS)) bits.push("first token " + s.firstTokenS.toFixed(2) + " s");
  if (Number.isFinite(s.cachedTokens)) {
    meta.dataset.cachedTokens = String(s.cachedTokens);
    bits.push(s.cachedTokens + " of " + s.promptTokens + " prompt tokens cached");
  }
  if (m.status === "stopped") bits.push("stopped");
  if (m.status === "done" && s.finish === "length") bits.push("cut at the token limit");
  meta.textContent = bits.join(" · ");
  return meta;
}

// Redraws a streaming reply soon (chunks that arrive meanwhile are batched).
function drawSoon(m) {
  if (state.drawTimer !== null) return;
  state.drawTimer = setTimeout(() => {
    state.drawTimer = null;
    drawNow(m);
  }, DRAW_EVERY_MS);
}

function drawNow(m) {
  const e = state.shown.get(m);
  if (!e) return;
  const box = $("messages");
  const atBottom = box.scrollHeight - box.scrollTop - box.clientHeight < 40;
  fillMessage(m, e);
  if (atBottom) box.scrollTop = box.scrollHeight;
}

function setBusy(busy) {
  document.body.dataset.busy = busy ? "true" : "false";
  $("send").hidden = busy;
  $("stop").hidden = !busy;
}

// ---- conversations -------------------------------------------------------

function openConversation(id) {
  state.activeId = id;
  store(KEYS.active, id);
  drawList();
  drawMessages();
  $("input").focus();
}

function newConversation() {
  const current = activeConversation();
  if (current && current.messages.length === 0) {
    $("input").focus();
    return current;
  }
  const c = { id: newId(), title: "", updated: Date.now(), messages: [] };
  state.conversations.push(c);
  state.activeId = c.id;
  saveConversations();
  drawList();
  drawMessages();
  $("input").focus();
  return c;
}

function deleteConversation(id) {
  if (state.stream && state.stream.conv.id === id) state.stream.controller.abort();
  state.conversations = state.conversations.filter((c) => c.id !== id);
  if (state.activeId === id) {
    const next = [...state.conversations].sort((a, b) => b.updated - a.updated)[0];
    state.activeId = next ? next.id : null;
  }
  saveConversations();
  drawList();
  drawMessages();
}

// ---- sending -------------------------------------------------------------

function requestBody(conv, upTo) {
  const messages = [];
  const system = state.settings.system.trim();
  if (system) messages.push({ role: "system", content: system });
  for (const m of conv.messages.slice(0, upTo)) {
    // Reasoning is not sent back: the answer is what the conversation holds.
    const content = m.role === "assistant" ? splitThink(m.content).answer : m.content;
    messages.push({ role: m.role, content });
  }
  const body = { messages, stream: true, stream_options: { include_usage: true } };
  if (state.model) body.model = state.model;
  const s = state.settings;
  const maxTokens = parseInt(s.maxTokens, 10);
  if (maxTokens >= 1) body.max_tokens = maxTokens;
  const temperature = parseFloat(s.temperature);
  if (Number.isFinite(temperature)) body.temperature = temperature;
  const seed = parseInt(s.seed, 10);
  if (Number.isFinite(seed)) body.seed = seed;
  return body;
}

// Reads a server-sent-event stream, handing each event's data to `onData`;
// stops early when it returns false.
async function readEvents(stream, onData) {
  const reader = stream.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += decoder.decode(value, { stream: true });
    for (;;) {
      const m = /\r?\n\r?\n/.exec(buf);
      if (!m) break;
      const block = buf.slice(0, m.index);
      buf = buf.slice(m.index + m[0].length);
      const data = block
        .split(/\r?\n/)
        .filter((l) => l.startsWith("data:"))
        .map((l) => l.slice(5).replace(/^ /, ""))
        .join("\n");
      if (data === "") continue; // a keep-alive comment
      if (onData(data) === false) {
        reader.cancel().catch(() => {});
        return;
      }
    }
  }
}

// Applies one chunk of /v1/chat/completions to the reply `m`.
function applyChunk(m, chunk, clock) {
  if (chunk.error) throw new Error(chunk.error.message || "the server reported an error");
  if (chunk.usage) m.usage = chunk.usage;
  if (chunk.timings) m.timings = chunk.timings;
  const choice = Array.isArray(chunk.choices) ? chunk.choices[0] : null;
  if (!choice) return;
  const d = choice.delta || {};
  const piece = (typeof d.content === "string" ? d.content : "") +
    (typeof d.reasoning_content === "string" ? d.reasoning_content : "") +
    (typeof d.reasoning === "string" ? d.reasoning : "");
  if (piece && clock.first === null) clock.first = performance.now();
  if (typeof d.content === "string") m.content += d.content;
  if (typeof d.reasoning_content === "string") m.reasoning += d.reasoning_content;
  else if (typeof d.reasoning === "string") m.reasoning += d.reasoning;
  if (Array.isArray(d.tool_calls)) {
    for (const t of d.tool_calls) {
      const k = Number.isInteger(t.index) ? t.index : m.toolCalls.length;
      const call = m.toolCalls[k] || (m.toolCalls[k] = { id: "", name: "", arguments: "" });
      if (t.id) call.id = t.id;
      if (t.function && typeof t.function.name === "string") call.name += t.function.name;
      if (t.function && typeof t.function.arguments === "string") call.arguments += t.function.arguments;
    }
    if (clock.first === null) clock.first = performance.now();
  }
  if (choice.finish_reason) m.finish = choice.finish_reason;
}

// What the meta line shows: the server's counts, times measured here.
function statsOf(m, clock) {
  const s = { finish: m.finish || null };
  const u = m.usage || {};
  const end = performance.now();
  if (Number.isFinite(u.completion_tokens)) s.completionTokens = u.completion_tokens;
  const details = u.prompt_tokens_details || {};
  if (Number.isFinite(details.cached_tokens) && Number.isFinite(u.prompt_tokens)) {
    s.cachedTokens = details.cached_tokens;
    s.promptTokens = u.prompt_tokens;
  }
  if (clock.first !== null) s.firstTokenS = (clock.first - clock.start) / 1000;
  if (m.timings && Number.isFinite(m.timings.predicted_per_second)) {
    s.tokPerS = m.timings.predicted_per_second;
  } else if (s.completionTokens > 1 && clock.first !== null && end > clock.first) {
    // Tokens after the first over the time they took (prefill excluded).
    s.tokPerS = (s.completionTokens - 1) / ((end - clock.first) / 1000);
  }
  return s;
}

async function send(text) {
  if (state.stream) return;
  let conv = activeConversation();
  if (!conv) conv = newConversation();
  conv.messages.push({ role: "user", content: text });
  if (!conv.title) conv.title = titleOf(text);
  const m = { role: "assistant", content: "", reasoning: "", toolCalls: [], status: "streaming", error: "", stats: {} };
  conv.messages.push(m);
  conv.updated = Date.now();
  const body = requestBody(conv, conv.messages.length - 1);
  saveConversations();
  drawList();
  drawMessages();
  const controller = new AbortController();
  state.stream = { controller, conv, msg: m };
  setBusy(true);
  notice("");
  const clock = { start: performance.now(), first: null };
  try {
    const res = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: Object.assign({ "Content-Type": "application/json" }, authHeaders()),
      body: JSON.stringify(body),
      signal: controller.signal,
    });
    if (!res.ok) throw new Error(await errorText(res));
    let finished = false;
    await readEvents(res.body, (data) => {
      if (data === "[DONE]") {
        finished = true;
        return false;
      }
      let chunk;
      try {
        chunk = JSON.parse(data);
      } catch (_) {
        throw new Error("the server sent an event that is not JSON: " + data.slice(0, 80));
      }
      applyChunk(m, chunk, clock);
      drawSoon(m);
      if (Date.now() - state.lastSave > SAVE_EVERY_MS) saveConversations();
      return true;
    });
    if (!finished && !m.finish) throw new Error("the reply ended before the server said it was complete");
    m.status = "done";
  } catch (e) {
    if (e.name === "AbortError") {
      m.status = "stopped";
    } else {
      m.status = "error";
      m.error = e.message;
      controller.abort();
    }
  } finally {
    m.stats = statsOf(m, clock);
    delete m.usage;
    delete m.timings;
    delete m.finish;
    state.stream = null;
    conv.updated = Date.now();
    saveConversations();
    if (state.drawTimer !== null) {
      clearTimeout(state.drawTimer);
      state.drawTimer = null;
    }
    drawNow(m);
    setBusy(false);
  }
}

// ---- wiring --------------------------------------------------------------

function bindSetting(id, key, onChange) {
  const input = $(id);
  input.value = str(state.settings[key]);
  input.addEventListener("change", () => {
    state.settings[key] = input.value;
    store(KEYS.settings, state.settings);
    if (onChange) onChange();
  });
}

function start() {
  bindSetting("api-key", "apiKey", fetchModel);
  bindSetting("system-prompt", "system");
  bindSetting("max-tokens", "maxTokens");
  bindSetting("temperature", "temperature");
  bindSetting("seed", "seed");

  $("new-chat").addEventListener("click", () => newConversation());
  $("stop").addEventListener("click", () => {
    if (state.stream) state.stream.controller.abort();
  });
  const input = $("input");
  $("composer").addEventListener("submit", (e) => {
    e.preventDefault();
    const text = input.value;
    if (!text.trim() || state.stream) return;
    input.value = "";
    send(text);
  });
  input.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      $("composer").requestSubmit();
    }
  });
  // Another tab changed the conversations: show its version when idle.
  window.addEventListener("storage", (e) => {
    if (e.key !== KEYS.conversations || state.stream) return;
    state.conversations = loadConversations();
    if (!activeConversation()) state.activeId = null;
    drawList();
    drawMessages();
  });

  if (!activeConversation()) {
    const newest = [...state.conversations].sort((a, b) => b.updated - a.updated)[0];
    state.activeId = newest ? newest.id : null;
  }
  setBusy(false);
  drawList();
  drawMessages();
  input.focus();
  fetchModel();
}

start();
