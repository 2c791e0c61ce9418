// Models: the list (/api/tags), pull with progress, create from a Modelfile, show, copy,
// delete; loaded models (/api/ps) with unload.

import { api, el, formatBytes, stream } from "./api.js";

const $ = (id) => document.getElementById(id);
let onChange = () => {};

export function initModels(changed) {
  onChange = changed;
  $("pull-form").addEventListener("submit", (e) => { e.preventDefault(); pull(); });
  $("create-form").addEventListener("submit", (e) => { e.preventDefault(); create(); });
  $("create-modelfile").addEventListener("input", () => gutter(null));
  $("create-modelfile").addEventListener("scroll", () => {
    $("create-gutter").scrollTop = $("create-modelfile").scrollTop;
  });
  $("ps-refresh").addEventListener("click", refreshPs);
  gutter(null);
}

function drafterOf(details) {
  const d = details && details.draft;
  if (!d) return "auto";
  return d.kind === "draft_model" ? `${d.kind} (${d.parameter_size || d.architecture || ""})` : d.kind;
}

export async function refreshModels() {
  const { models = [] } = await api("/api/tags");
  const rows = models.map((m) => {
    const d = m.details || {};
    return el("tr", { dataset: { name: m.name } },
      el("td", {}, m.name, m.state === "damaged" ? el("span", { className: "badge bad", title: m.damage || "" }, "damaged") : null),
      el("td", {}, formatBytes(m.size)),
      el("td", {}, d.family || ""),
      el("td", {}, d.quantization_level || ""),
      el("td", {}, drafterOf(d)),
      el("td", { className: "actions" },
        el("button", { onclick: () => show(m.name) }, "Show"),
        el("button", { onclick: () => copy(m.name) }, "Copy"),
        el("button", { className: "danger", onclick: () => remove(m.name) }, "Delete")));
  });
  $("model-table").tBodies[0].replaceChildren(...rows);
  onChange(models);
  return models;
}

async function pull() {
  const name = $("pull-name").value.trim();
  if (!name) return;
  const bar = $("pull-progress");
  const status = $("pull-status");
  bar.hidden = false;
  bar.value = 0;
  status.className = "";
  status.textContent = "pulling manifest";
  try {
    await stream("/api/pull", { model: name, insecure: $("pull-insecure").checked }, (obj) => {
      if (obj.total) {
        bar.max = obj.total;
        bar.value = obj.completed || 0;
        status.textContent = `${obj.status}: ${formatBytes(obj.completed || 0)} of ${formatBytes(obj.total)}`;
      } else {
        status.textContent = obj.status || "";
      }
    });
    bar.value = bar.max;
    await refreshModels();
  } catch (err) {
    status.className = "error";
    status.textContent = err.message;
  }
}

// Line numbers beside the Modelfile; `bad` (1-based) is the line an error names.
function gutter(bad) {
  const count = $("create-modelfile").value.split("\n").length;
  const items = [];
  for (let i = 1; i <= count; i += 1) items.push(el("li", { className: i === bad ? "bad" : "" }, String(i)));
  $("create-gutter").replaceChildren(...items);
}

async function create() {
  const model = $("create-name").value.trim();
  const modelfile = $("create-modelfile").value;
  const status = $("create-status");
  status.className = "";
  status.textContent = "creating…";
  gutter(null);
  try {
    await stream("/api/create", { model, modelfile }, (obj) => { status.textContent = obj.status || ""; });
    await refreshModels();
  } catch (err) {
    const m = /\(line (\d+)\)/.exec(err.message);
    status.className = "error";
    status.textContent = err.message;
    if (m) {
      const line = Number(m[1]);
      gutter(line);
      status.dataset.line = String(line);
      status.textContent = `line ${line}: ${err.message.replace(m[0], "").replace(/^:\s*/, "").trim()}`;
      const lines = modelfile.split("\n");
      const start = lines.slice(0, line - 1).reduce((n, l) => n + l.length + 1, 0);
      const area = $("create-modelfile");
      area.focus();
      area.setSelectionRange(start, start + (lines[line - 1] || "").length);
    }
  }
}

async function show(name) {
  const info = await api("/api/show", { model: name });
  $("show").hidden = false;
  $("show-title").textContent = name;
  const section = (title, text) => (text ? el("details", { open: title === "Modelfile" },
    el("summary", {}, title), el("pre", {}, text)) : null);
  const drafting = info.drafting ? JSON.stringify(info.drafting, null, 2) : "";
  $("show-body").replaceChildren(
    el("p", {}, `capabilities: ${(info.capabilities || []).join(", ") || "-"}`),
    section("Modelfile", info.modelfile),
    section("Parameters", info.parameters),
    section("Template", info.template),
    section("License", Array.isArray(info.license) ? info.license.join("\n\n") : info.license),
    section("Drafters", drafting));
}

async function copy(name) {
  const destination = prompt(`Copy ${name} to:`, `${name.split(":")[0]}-copy`);
  if (!destination) return;
  try {
    await api("/api/copy", { source: name, destination });
    await refreshModels();
  } catch (err) {
    alert(err.message);
  }
}

async function remove(name) {
  if (!confirm(`Delete ${name}? Blobs no other model uses are removed.`)) return;
  try {
    await api("/api/delete", { model: name }, "DELETE");
    await refreshModels();
  } catch (err) {
    alert(err.message);
  }
}

export async function refreshPs() {
  const { models = [] } = await api("/api/ps");
  const rows = models.map((m) => {
    const gpu = m.size ? Math.round((100 * (m.size_vram || 0)) / m.size) : 0;
    const processor = gpu === 0 ? "100% CPU" : gpu === 100 ? "100% GPU" : `${100 - gpu}%/${gpu}% CPU/GPU`;
    const draft = m.draft || {};
    return el("tr", { dataset: { name: m.name } },
      el("td", {}, m.name),
      el("td", {}, formatBytes(m.size)),
      el("td", {}, processor),
      el("td", {}, draft.in_use || draft.kind || "-"),
      el("td", {}, draft.acceptance !== undefined ? `${Math.round(draft.acceptance * 100)}%` : "-"),
      el("td", {}, m.expires_at ? new Date(m.expires_at).toLocaleTimeString() : ""),
      el("td", {}, el("button", { onclick: () => unload(m.name) }, "Unload")));
  });
  $("ps-table").tBodies[0].replaceChildren(...rows);
}

async function unload(name) {
  await api("/api/generate", { model: name, keep_alive: 0 });
  await refreshPs();
}
