// Calls to the daemon's own API (same origin only: every path is relative to this page).

export class ApiError extends Error {
  constructor(message, status) {
    super(message);
    this.status = status;
  }
}

async function errorOf(response) {
  const text = await response.text();
  try {
    const body = JSON.parse(text);
    if (body && typeof body.error === "string") return new ApiError(body.error, response.status);
  } catch (_) { /* not JSON */ }
  return new ApiError(text || `${response.status} ${response.statusText}`, response.status);
}

export async function api(path, body, method) {
  const init = { method: method || (body === undefined ? "GET" : "POST"), headers: {} };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  if (!response.ok) throw await errorOf(response);
  const text = await response.text();
  return text ? JSON.parse(text) : {};
}

// POST a streaming request and call onObject for each NDJSON line; an {"error"} line throws.
export async function stream(path, body, onObject, signal) {
  const response = await fetch(path, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify(body),
    signal,
  });
  if (!response.ok) throw await errorOf(response);
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let newline;
    while ((newline = buffer.indexOf("\n")) >= 0) {
      const line = buffer.slice(0, newline).trim();
      buffer = buffer.slice(newline + 1);
      if (line) deliver(line, onObject);
    }
  }
  if (buffer.trim()) deliver(buffer.trim(), onObject);
}

function deliver(line, onObject) {
  const object = JSON.parse(line);
  if (object && typeof object.error === "string") throw new ApiError(object.error, 200);
  onObject(object);
}

export function formatBytes(n) {
  if (!Number.isFinite(n) || n <= 0) return "0 B";
  const units = ["B", "KB", "MB", "GB", "TB"];
  const i = Math.min(units.length - 1, Math.floor(Math.log(n) / Math.log(1000)));
  return `${(n / 1000 ** i).toFixed(i ? 1 : 0)} ${units[i]}`;
}

// Build an element: el("td", {className: "x"}, "text", child). Text is always text.
export function el(tag, props, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (key === "dataset") Object.assign(node.dataset, value);
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node[key] = value;
  }
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}
