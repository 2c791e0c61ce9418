// Markdown to DOM nodes, safely: the model's text only ever becomes text nodes (textContent),
// never HTML. `drafted` is a per-character mask (1: the character came from an accepted draft);
// text runs are split on it so that drafted tokens stay shaded inside the rendered Markdown.
//
// The subset: fenced code blocks, headings, bullet and numbered lists, block quotes,
// paragraphs with line breaks; inline `code`, **bold**, *italic* / _italic_ and [links](http...).

const FENCE = /^\s{0,3}(```|~~~)\s*([\w+.#-]*)\s*$/;
const HEADING = /^(#{1,6})\s+/;
const BULLET = /^\s{0,3}[-*+]\s+/;
const NUMBERED = /^\s{0,3}\d{1,9}[.)]\s+/;
const QUOTE = /^\s{0,3}>\s?/;

export function renderMarkdown(target, source, drafted) {
  target.replaceChildren();
  const lines = [];
  let offset = 0;
  for (const text of source.split("\n")) {
    lines.push({ text, start: offset });
    offset += text.length + 1;
  }
  const ctx = { source, drafted };
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    const fence = FENCE.exec(line.text);
    if (fence) {
      const body = [];
      i += 1;
      while (i < lines.length && !lines[i].text.trim().startsWith(fence[1])) body.push(lines[i++]);
      i += 1; // the closing fence (or the end of an unfinished block while streaming)
      const pre = document.createElement("pre");
      const code = document.createElement("code");
      if (fence[2]) pre.dataset.lang = fence[2];
      body.forEach((b, k) => {
        if (k) code.append("\n");
        run(ctx, code, b.start, b.start + b.text.length);
      });
      pre.append(code);
      target.append(pre);
      continue;
    }
    if (!line.text.trim()) { i += 1; continue; }
    const heading = HEADING.exec(line.text);
    if (heading) {
      const h = document.createElement(`h${Math.min(6, heading[1].length + 2)}`);
      inline(ctx, h, line.start + heading[0].length, line.start + line.text.length);
      target.append(h);
      i += 1;
      continue;
    }
    const listKind = BULLET.test(line.text) ? BULLET : NUMBERED.test(line.text) ? NUMBERED : null;
    if (listKind) {
      const list = document.createElement(listKind === BULLET ? "ul" : "ol");
      while (i < lines.length && listKind.test(lines[i].text)) {
        const m = listKind.exec(lines[i].text);
        const li = document.createElement("li");
        inline(ctx, li, lines[i].start + m[0].length, lines[i].start + lines[i].text.length);
        list.append(li);
        i += 1;
      }
      target.append(list);
      continue;
    }
    const block = document.createElement(QUOTE.test(line.text) ? "blockquote" : "p");
    const quoted = block.tagName === "BLOCKQUOTE";
    let first = true;
    while (i < lines.length && lines[i].text.trim() && !FENCE.test(lines[i].text)
           && !HEADING.test(lines[i].text) && QUOTE.test(lines[i].text) === quoted
           && (first || !(BULLET.test(lines[i].text) || NUMBERED.test(lines[i].text)))) {
      if (!first) block.append(document.createElement("br"));
      const skip = quoted ? QUOTE.exec(lines[i].text)[0].length : 0;
      inline(ctx, block, lines[i].start + skip, lines[i].start + lines[i].text.length);
      first = false;
      i += 1;
    }
    target.append(block);
  }
}

// Inline spans of source[start, end).
function inline(ctx, parent, start, end) {
  const s = ctx.source;
  let plain = start;
  let i = start;
  while (i < end) {
    const ch = s[i];
    let handled = false;
    if (ch === "`") {
      const close = s.indexOf("`", i + 1);
      if (close > i && close < end) {
        run(ctx, parent, plain, i);
        const code = document.createElement("code");
        run(ctx, code, i + 1, close);
        parent.append(code);
        i = plain = close + 1;
        handled = true;
      }
    } else if ((ch === "*" || ch === "_") && s[i + 1] !== " ") {
      const marker = s.startsWith(ch + ch, i) ? ch + ch : ch;
      const close = s.indexOf(marker, i + marker.length + 1);
      const word = /\w/;
      const intraword = ch === "_" && (word.test(s[i - 1] || "") || word.test(s[close + marker.length] || ""));
      if (close > i && close + marker.length <= end && s[close - 1] !== " " && !intraword) {
        run(ctx, parent, plain, i);
        const node = document.createElement(marker.length === 2 ? "strong" : "em");
        inline(ctx, node, i + marker.length, close);
        parent.append(node);
        i = plain = close + marker.length;
        handled = true;
      }
    } else if (ch === "[") {
      const m = /^\[([^\]\n]+)\]\((https?:\/\/[^\s)]+)\)/.exec(s.slice(i, end));
      if (m) {
        run(ctx, parent, plain, i);
        const a = document.createElement("a");
        a.href = m[2]; // only http(s): never a javascript: or data: URL
        a.rel = "noopener noreferrer";
        a.target = "_blank";
        run(ctx, a, i + 1, i + 1 + m[1].length);
        parent.append(a);
        i = plain = i + m[0].length;
        handled = true;
      }
    }
    if (!handled) i += 1;
  }
  run(ctx, parent, plain, end);
}

// Text of source[start, end) as text nodes, drafted stretches inside <span class="drafted">.
function run(ctx, parent, start, end) {
  if (end <= start) return;
  const { source, drafted } = ctx;
  if (!drafted) { parent.append(document.createTextNode(source.slice(start, end))); return; }
  let a = start;
  while (a < end) {
    const flag = drafted[a] === 1;
    let b = a + 1;
    while (b < end && (drafted[b] === 1) === flag) b += 1;
    const text = document.createTextNode(source.slice(a, b));
    if (flag) {
      const span = document.createElement("span");
      span.className = "drafted";
      span.append(text);
      parent.append(span);
    } else {
      parent.append(text);
    }
    a = b;
  }
}

// The per-character mask of a reply streamed as [text, drafted] pieces.
export function draftMask(pieces) {
  const total = pieces.reduce((n, p) => n + p[0].length, 0);
  const mask = new Uint8Array(total);
  let at = 0;
  for (const [text, drafted] of pieces) {
    if (drafted) mask.fill(1, at, at + text.length);
    at += text.length;
  }
  return mask;
}
