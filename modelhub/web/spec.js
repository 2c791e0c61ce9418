// Speculative decoding, visible: live figures while a reply streams, the final acceptance with a
// per-position bar chart, and "compare" (the same request with drafting off and the same seed).

import { api, el } from "./api.js";

const $ = (id) => document.getElementById(id);
const pct = (a, n) => (n > 0 ? `${((100 * a) / n).toFixed(0)}%` : "-");

// Counts tokens as they stream and polls /api/ps for the model's draft counters, whose growth
// since the request started is this reply's acceptance (other requests on the same model
// running at the same time would count too).
export class LiveStats {
  constructor(model) {
    this.model = model;
    this.tokens = 0;
    this.drafted = 0;
    this.first = null;
    this.last = null;
    this.base = null;
    this.checked = 0;
    this.kept = 0;
    this.drafter = null;
    this.stopped = false;
    this.timer = setInterval(() => this.poll(), 1000);
    this.poll();
  }

  token(drafted) {
    const now = performance.now();
    if (this.first === null) this.first = now;
    this.last = now;
    this.tokens += 1;
    if (drafted) this.drafted += 1;
  }

  tps() {
    if (this.tokens < 2 || this.last <= this.first) return null;
    return ((this.tokens - 1) * 1000) / (this.last - this.first);
  }

  async poll() {
    try {
      const ps = await api("/api/ps");
      const entry = (ps.models || []).find((m) => m.name === this.model || m.model === this.model);
      const draft = entry && entry.draft;
      if (!draft) return;
      const now = { checked: draft.draft_count || 0, kept: draft.draft_accepted_count || 0 };
      if (this.base === null) this.base = now;
      this.checked = now.checked - this.base.checked;
      this.kept = now.kept - this.base.kept;
      this.drafter = draft.in_use || draft.kind || null;
    } catch (_) { /* the figures wait for the next poll */ }
  }

  summary() {
    const tps = this.tps();
    return { eval_count: this.tokens, live_tps: tps, draft_count: this.checked,
      draft_accepted_count: this.kept, drafter: this.drafter };
  }

  stop() {
    this.stopped = true;
    clearInterval(this.timer);
  }
}

export function showLive(live) {
  $("spec").hidden = false;
  $("spec").classList.add("live");
  $("spec-drafter").textContent = live.drafter || "-";
  $("spec-acceptance").textContent = live.checked ? `${pct(live.kept, live.checked)} (${live.kept}/${live.checked})` : "-";
  $("spec-drafted").textContent = live.tokens ? `${pct(live.drafted, live.tokens)} of ${live.tokens} tokens` : "-";
  const tps = live.tps();
  $("spec-tps").textContent = tps ? tps.toFixed(1) : "-";
}

export function tokensPerSecond(stats) {
  if (stats.eval_count && stats.eval_duration) return (stats.eval_count * 1e9) / stats.eval_duration;
  return stats.live_tps || null;
}

export function showFinal(stats) {
  $("spec").classList.remove("live");
  const drafted = stats.draft_count !== undefined;
  $("spec-drafter").textContent = stats.drafter || (drafted ? "-" : "none");
  $("spec-acceptance").textContent = drafted
    ? `${pct(stats.draft_accepted_count, stats.draft_count)} (${stats.draft_accepted_count}/${stats.draft_count})`
    : "nothing drafted";
  $("spec-drafted").textContent = stats.draft_speedup ? `est. speed-up ×${stats.draft_speedup.toFixed(2)}` : "-";
  const tps = tokensPerSecond(stats);
  $("spec-tps").textContent = tps ? tps.toFixed(1) : "-";
  drawChart(stats.draft_count_by_position || [], stats.draft_accepted_by_position || []);
}

// One bar per draft position: its height is that position's acceptance (kept / checked).
function drawChart(counts, accepted) {
  const bars = counts.map((n, i) => {
    const rate = n ? (accepted[i] || 0) / n : 0;
    const bar = el("span", { className: "bar", title: `position ${i + 1}: ${accepted[i] || 0}/${n} kept` });
    bar.append(el("span", { className: `fill h${Math.round(rate * 20)}` }));
    return bar;
  });
  $("spec-chart").replaceChildren(...bars);
  $("spec-chart").hidden = bars.length === 0;
}

// Rerun the reply's request with drafting off and the same seed; show both texts and speeds.
export async function compare(reply) {
  const body = { ...reply.request, stream: false, options: { ...reply.request.options, draft: "off" } };
  const off = await api("/api/chat", body);
  const on = { content: reply.content, stats: reply.stats || {} };
  const offText = (off.message && off.message.content) || "";
  $("compare-on").textContent = on.content;
  $("compare-off").textContent = offText;
  const onTps = tokensPerSecond(on.stats);
  const offTps = tokensPerSecond(off);
  $("compare-on-speed").textContent = onTps ? `${onTps.toFixed(1)} tokens/s` : "";
  $("compare-off-speed").textContent = offTps ? `${offTps.toFixed(1)} tokens/s` : "";
  const verdict = $("compare-verdict");
  if (on.content === offText) {
    const ratio = onTps && offTps ? `; drafting ran at ×${(onTps / offTps).toFixed(2)} the speed` : "";
    verdict.textContent = `identical texts (seed ${reply.request.options.seed})${ratio}`;
    verdict.className = "verdict same";
  } else {
    let at = 0;
    while (at < on.content.length && on.content[at] === offText[at]) at += 1;
    const why = on.stats.stopped ? " (the drafted reply was stopped early)" : "";
    verdict.textContent = `the texts differ from character ${at}${why}`;
    verdict.className = "verdict differ";
  }
  $("compare-result").hidden = false;
  return { same: on.content === offText, onTps, offTps };
}
