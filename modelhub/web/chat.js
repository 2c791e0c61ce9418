// The chat: conversations (kept in this browser's localStorage only), streaming, stop,
// edit-and-resend, thinking, tool calls, images, and the speculative-decoding panel.

import { api, el, stream } from "./api.js";
import { draftMask, renderMarkdown } from "./render.js";
import { LiveStats, compare, showFinal, showLive } from "./spec.js";

const STORE_KEY = "modelhub.chats";
const $ = (id) => document.getElementById(id);

const state = { chats: [], current: null, busy: null, models: [], images: [] };

function load() {
  try {
    const saved = JSON.parse(localStorage.getItem(STORE_KEY) || "[]");
    state.chats = Array.isArray(saved) ? saved.filter((c) => c && Array.isArray(c.messages)) : [];
  } catch (_) {
    state.chats = [];
  }
  state.current = state.chats[0] || newChat();
}

function save() {
  try {
    localStorage.setItem(STORE_KEY, JSON.stringify(state.chats));
  } catch (err) {
    setStatus(`could not save the conversation: ${err.message}`);
  }
}

function newChat() {
  const chat = { id: crypto.randomUUID(), title: "New chat", model: $("model").value, messages: [] };
  state.chats.unshift(chat);
  return chat;
}

export function setStatus(text) {
  $("status").textContent = text || "";
}

// A model's capabilities as /api/show reports them (/api/tags leaves out `vision`, which comes
// from the projector), fetched once per model name and digest.
const shown = new Map();
const known = new Map();

function capabilities(name) {
  const m = state.models.find((x) => x.name === name);
  if (!m) return Promise.resolve([]);
  const key = `${m.name}@${m.digest}`;
  if (!shown.has(key)) {
    shown.set(key, api("/api/show", { model: m.name }).then((info) => {
      known.set(key, info.capabilities || []);
      return known.get(key);
    }, () => {
      shown.delete(key);
      return m.capabilities || [];
    }));
  }
  return shown.get(key);
}

function knownCapabilities(name) {
  const m = state.models.find((x) => x.name === name);
  return (m && known.get(`${m.name}@${m.digest}`)) || null;
}

// --- the page ------------------------------------------------------------------------------

export function initChat(models) {
  state.models = models;
  load();
  $("new-chat").addEventListener("click", () => { state.current = newChat(); save(); draw(); });
  $("composer").addEventListener("submit", (e) => { e.preventDefault(); send(); });
  $("prompt").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); send(); }
  });
  $("stop").addEventListener("click", () => state.busy && state.busy.abort());
  $("model").addEventListener("change", () => {
    state.current.model = $("model").value;
    save();
    modelHints();
  });
  $("system").addEventListener("change", () => { state.current.system = $("system").value; save(); });
  $("compare").addEventListener("click", () => runCompare());
  for (const type of ["dragover", "drop"]) $("chat-main").addEventListener(type, onDrop);
  draw();
}

export function setModels(models) {
  state.models = models;
  const select = $("model");
  const keep = state.current ? state.current.model : select.value;
  select.replaceChildren(...models.map((m) => el("option", { value: m.name }, m.name)));
  if (models.some((m) => m.name === keep)) select.value = keep;
  modelHints();
}

function draw() {
  const list = $("conversation-list");
  list.replaceChildren(...state.chats.map((chat) => el("li", { className: chat === state.current ? "active" : "" },
    el("button", { className: "title", onclick: () => { state.current = chat; draw(); } }, chat.title),
    el("button", { className: "icon", title: "delete this conversation", onclick: () => {
      state.chats = state.chats.filter((c) => c !== chat);
      if (state.current === chat) state.current = state.chats[0] || newChat();
      save();
      draw();
    } }, "×"))));
  const chat = state.current;
  if (chat.model && [...$("model").options].some((o) => o.value === chat.model)) $("model").value = chat.model;
  modelHints();
  $("system").value = chat.system || "";
  const box = $("messages");
  box.replaceChildren(...chat.messages.map((m, i) => messageNode(m, i)));
  box.scrollTop = box.scrollHeight;
  const last = chat.messages[chat.messages.length - 1];
  $("spec").hidden = !(last && last.stats);
  $("compare-result").hidden = true;
  if (last && last.stats) showFinal(last.stats);
  $("compare").disabled = !(last && last.role === "assistant" && last.request) || Boolean(state.busy);
}

function messageNode(m, index) {
  const node = el("div", { className: `message ${m.role}`, dataset: { index: String(index) } });
  node.append(el("div", { className: "role" }, m.role));
  if (m.thinking) {
    node.append(el("details", { className: "thinking" }, el("summary", {}, "Thinking"),
      el("div", { className: "thinking-text" }, m.thinking)));
  }
  const body = el("div", { className: "content" });
  const text = m.content || "";
  renderMarkdown(body, text, m.pieces ? draftMask(m.pieces) : null);
  node.append(body);
  for (const call of m.tool_calls || []) {
    const fn = call.function || {};
    node.append(el("div", { className: "tool-call" }, el("span", { className: "badge" }, "tool call"),
      el("code", {}, `${fn.name}(${JSON.stringify(fn.arguments || {})})`)));
  }
  if (m.images && m.images.length) {
    node.append(el("div", { className: "thumbs" },
      ...m.images.map((b64) => el("img", { src: imageSrc(b64), alt: "attached image" }))));
  }
  if (m.error) node.append(el("div", { className: "error" }, m.error));
  if (m.role === "user") {
    node.append(el("button", { className: "edit", onclick: () => editMessage(node, index) }, "Edit"));
  }
  return node;
}

function editMessage(node, index) {
  if (state.busy) return;
  const m = state.current.messages[index];
  const area = el("textarea", { className: "edit-text", rows: 3, value: m.content });
  const resend = el("button", { className: "resend", onclick: () => {
    state.current.messages = state.current.messages.slice(0, index);
    state.current.messages.push({ ...m, content: area.value });
    save();
    generate();
  } }, "Resend");
  node.replaceChildren(el("div", { className: "role" }, "user"), area,
    el("div", { className: "row" }, resend, el("button", { onclick: draw }, "Cancel")));
  area.focus();
}

// --- images --------------------------------------------------------------------------------

// The type of an image from its first bytes (the base64 of the signatures of the formats
// libmtmd reads), so that a thumbnail's data: URL names it.
const SIGNATURES = [["iVBORw0KGgo", "image/png"], ["/9j/", "image/jpeg"], ["R0lGOD", "image/gif"],
  ["UklGR", "image/webp"], ["Qk", "image/bmp"]];

function imageSrc(b64) {
  const known = SIGNATURES.find(([head]) => b64.startsWith(head));
  return `data:${known ? known[1] : "application/octet-stream"};base64,${b64}`;
}

// What the chosen model can take: images (the drop hint) and a thinking setting (shown only
// for a model whose template reasons: /api/chat refuses `think` for the others).
async function modelHints() {
  const model = $("model").value;
  const caps = await capabilities(model);
  if ($("model").value !== model) return;
  $("drop-hint").textContent = caps.includes("vision") ? "drop images here to attach them" : "";
  $("think-label").hidden = !caps.includes("thinking");
}

// `think` as /api/chat takes it: true, false or a level; undefined leaves the model's default.
function readThink() {
  const value = $("opt-think").value;
  if ($("think-label").hidden || value === "") return undefined;
  return value === "true" ? true : value === "false" ? false : value;
}

async function onDrop(e) {
  if (!e.dataTransfer || ![...e.dataTransfer.types].includes("Files")) return;
  e.preventDefault();
  const model = $("model").value;
  if (e.type === "dragover") {
    const caps = knownCapabilities(model);
    if (caps) e.dataTransfer.dropEffect = caps.includes("vision") ? "copy" : "none";
    return;
  }
  const files = [...e.dataTransfer.files]; // readable only while the event is dispatched
  if (!(await capabilities(model)).includes("vision")) {
    setStatus(`${model} cannot read images (it has no vision projector): nothing was attached`);
    return;
  }
  const skipped = [];
  for (const file of files) {
    if (!file.type.startsWith("image/")) {
      skipped.push(file.name);
      continue;
    }
    const reader = new FileReader();
    reader.onload = () => {
      state.images.push(String(reader.result).split(",", 2)[1]);
      drawAttachments();
    };
    reader.onerror = () => setStatus(`could not read ${file.name}`);
    reader.readAsDataURL(file);
  }
  setStatus(skipped.length ? `not an image, not attached: ${skipped.join(", ")}` : "");
}

function drawAttachments() {
  $("attachments").replaceChildren(...state.images.map((b64, i) => el("span", { className: "thumb" },
    el("img", { src: imageSrc(b64), alt: "image to send" }),
    el("button", { className: "icon", onclick: () => { state.images.splice(i, 1); drawAttachments(); } }, "×"))));
}

// --- sending -------------------------------------------------------------------------------

function send() {
  const text = $("prompt").value;
  if (state.busy || (!text.trim() && !state.images.length)) return;
  const chat = state.current;
  const message = { role: "user", content: text };
  if (state.images.length) message.images = state.images.splice(0);
  chat.messages.push(message);
  if (chat.title === "New chat") chat.title = text.trim().slice(0, 40) || "images";
  $("prompt").value = "";
  drawAttachments();
  save();
  generate();
}

export function readOptions() {
  const options = {};
  for (const key of ["temperature", "seed", "num_ctx", "num_predict"]) {
    const raw = $(`opt-${key}`).value;
    if (raw !== "") options[key] = Number(raw);
  }
  // Every request carries a seed, so that "compare" can rerun it exactly.
  if (options.seed === undefined) options.seed = Math.floor(Math.random() * 2 ** 31);
  options.draft = $("opt-draft").checked ? "auto" : "off";
  return options;
}

function requestBody(chat) {
  const messages = [];
  if (chat.system) messages.push({ role: "system", content: chat.system });
  for (const m of chat.messages) {
    const out = { role: m.role, content: m.content || "" };
    if (m.images) out.images = m.images;
    if (m.thinking) out.thinking = m.thinking;
    if (m.tool_calls) out.tool_calls = m.tool_calls;
    messages.push(out);
  }
  const body = { model: $("model").value, messages, options: readOptions(), stream: true };
  const think = readThink();
  if (think !== undefined) body.think = think;
  const tools = $("tools").value.trim();
  if (tools) body.tools = JSON.parse(tools);
  return body;
}

async function generate() {
  const chat = state.current;
  chat.model = $("model").value;
  let body;
  try {
    body = requestBody(chat);
  } catch (err) {
    setStatus(`tools: ${err.message}`);
    return;
  }
  const reply = { role: "assistant", content: "", pieces: [], request: body };
  chat.messages.push(reply);
  const controller = new AbortController();
  state.busy = controller;
  $("stop").disabled = false;
  $("send").disabled = true;
  draw();
  const index = chat.messages.length - 1;
  const live = new LiveStats(body.model);
  $("spec").hidden = false;
  let pending = false;
  const paint = () => {
    pending = false;
    const box = $("messages");
    if (state.current === chat && box.lastElementChild) {
      const open = box.lastElementChild.querySelector("details.thinking[open]");
      const node = messageNode(reply, index);
      if (open) node.querySelector("details.thinking").open = true;
      box.lastElementChild.replaceWith(node);
      box.scrollTop = box.scrollHeight;
    }
    if (!live.stopped) showLive(live);
  };
  setStatus("generating…");
  try {
    await stream("/api/chat", body, (obj) => {
      const msg = obj.message || {};
      if (msg.content) {
        reply.content += msg.content;
        reply.pieces.push([msg.content, obj.drafted === true]);
        live.token(obj.drafted === true);
      }
      if (msg.thinking) {
        reply.thinking = (reply.thinking || "") + msg.thinking;
        live.token(obj.drafted === true);
      }
      if (msg.tool_calls) reply.tool_calls = [...(reply.tool_calls || []), ...msg.tool_calls];
      if (obj.done) reply.stats = { ...final(obj), seed: body.options.seed };
      // At most ~8 repaints a second: on a small machine the browser shares the CPU with the model.
      if (!pending) { pending = true; setTimeout(() => requestAnimationFrame(paint), 120); }
    }, controller.signal);
    setStatus("");
  } catch (err) {
    if (err.name === "AbortError") {
      reply.stats = { stopped: true, ...live.summary() };
      setStatus("stopped");
    } else {
      reply.error = err.message;
      setStatus("");
    }
  } finally {
    live.stop();
    state.busy = null;
    $("stop").disabled = true;
    $("send").disabled = false;
    save();
    draw();
  }
}

function final(obj) {
  const keys = ["done_reason", "eval_count", "eval_duration", "prompt_eval_count", "total_duration",
    "draft_count", "draft_accepted_count", "draft_count_by_position", "draft_accepted_by_position",
    "drafter", "draft_speedup", "draft_note"];
  const out = {};
  for (const k of keys) if (obj[k] !== undefined) out[k] = obj[k];
  return out;
}

async function runCompare() {
  const messages = state.current.messages;
  const last = messages[messages.length - 1];
  if (!last || !last.request || state.busy) return;
  $("compare").disabled = true;
  setStatus("comparing: the same request with drafting off…");
  try {
    await compare(last);
    setStatus("");
  } catch (err) {
    setStatus(`compare: ${err.message}`);
  } finally {
    $("compare").disabled = false;
  }
}

