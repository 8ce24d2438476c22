// dossier inspector: one retrieve call with trace: true, or an earlier call, shown as the API returned it.
// Every piece of response text reaches the page through text nodes (el() below): never as HTML.
"use strict";

const KEY_STORE = "dossier.inspector.key"; // sessionStorage only: gone when the tab closes
const SOURCES = ["properties", "memories", "documents", "graph", "external"];
const LAYERS = ["recall", "filter", "govern", "rerank", "select", "budget"]; // the pipeline's order
const EXAMPLE = {
  kind: "email", value: "jane@acme.com", mode: "brief", depth: "standard", budget: 8000,
  message: "What pricing did we discuss, and what discount rules apply?",
};
const OUTPUT = ["error", "summary", "call", "record", "sources", "budget-section", "funnel", "items", "synthesis",
  "layers", "raw"];

const $ = (id) => document.getElementById(id);

// An element with attributes and children; strings become text nodes, null/undefined are skipped.
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name === "class") node.className = value;
    else if (name === "dataset") Object.assign(node.dataset, value);
    else node.setAttribute(name, String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.appendChild(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function show(id, ...children) {
  const section = $(id);
  section.replaceChildren(...children.flat().filter((c) => c !== null && c !== undefined));
  section.hidden = false;
  return section;
}

function clearOutput() {
  for (const id of OUTPUT) {
    $(id).replaceChildren();
    $(id).hidden = true;
  }
}

function text(value) {
  if (value === null || value === undefined) return "—";
  if (typeof value === "object") return JSON.stringify(value);
  return String(value);
}

function score(value) {
  return typeof value === "number" ? value.toFixed(3) : "—";
}

function badge(label, kind) {
  return el("span", { class: `badge ${kind || label}` }, label);
}

function dl(pairs) {
  const list = el("dl");
  for (const [name, value] of pairs) {
    if (value === undefined) continue;
    list.append(el("dt", null, name), el("dd", null, value instanceof Node ? value : text(value)));
  }
  return list;
}

function table(headers, rows, numeric) {
  const head = el("tr", null, headers.map((h, i) => el("th", { class: numeric && numeric.includes(i) ? "num" : null }, h)));
  const body = rows.map((cells) =>
    el("tr", null, cells.map((c, i) => el("td", { class: numeric && numeric.includes(i) ? "num" : null },
      c instanceof Node ? c : text(c)))));
  return el("table", null, el("thead", null, head), el("tbody", null, body));
}

// -- the key ---------------------------------------------------------------------------------------------
function key() {
  const given = $("key").value.trim();
  if (given) sessionStorage.setItem(KEY_STORE, given);
  return given;
}

async function api(path, options) {
  const apiKey = key();
  if (!apiKey) throw new Failure(null, "Enter an API key first (dossier keys create --org ORG --caller CALLER).");
  const headers = { Authorization: `Bearer ${apiKey}`, Accept: "application/json" };
  if (options && options.body) headers["Content-Type"] = "application/json";
  let response;
  try {
    response = await fetch(path, { ...options, headers, credentials: "omit", cache: "no-store" });
  } catch (error) {
    throw new Failure(null, `The service did not answer: ${error.message}`);
  }
  let body = null;
  try {
    body = await response.json();
  } catch (error) {
    body = null;
  }
  if (!response.ok) {
    const detail = (body && body.detail) || {};
    throw new Failure(response.status, detail.message || response.statusText, detail.field, detail.problems);
  }
  return body;
}

class Failure extends Error {
  constructor(status, message, field, problems) {
    super(message);
    this.status = status;
    this.field = field;
    this.problems = problems;
  }
}

function showError(error) {
  const status = error.status ? `HTTP ${error.status}: ` : "";
  show("error",
    el("strong", null, status + error.message),
    error.field ? el("div", null, "field: ", el("code", null, error.field)) : null,
    error.problems ? el("ul", null, error.problems.map((p) => el("li", null, p))) : null);
  document.body.dataset.state = "error";
}

// -- a retrieve call ---------------------------------------------------------------------------------------
function request() {
  const body = { trace: true, depth: $("depth").value };
  if ($("mode").value) body.mode = $("mode").value;
  const value = $("record-value").value.trim();
  if (value) body.record = { [$("record-kind").value]: value };
  const message = $("message").value.trim();
  if (message) body.message = message;
  const budget = Number($("budget").value);
  if ($("budget").value !== "") body.budget = { totalTokens: Number.isInteger(budget) ? budget : $("budget").value };
  const fetch = list("fetch");
  if (fetch.length) body.fetch = fetch;
  const tags = list("tags");
  if (tags.length) body.filters = { tags };
  const continuation = $("continuation").value.trim();
  if (continuation) body.continuation = continuation;
  return body;
}

// The comma-separated entries of an input, trimmed, the empty ones left out.
const list = (id) => $(id).value.split(",").map((part) => part.trim()).filter(Boolean);

// The next page of a call that did not fit: an expand call with its continuation (and the same budget).
function nextPage(continuation) {
  for (const id of ["record-value", "fetch", "tags"]) $(id).value = "";
  $("continuation").value = continuation;
  $("mode").value = "expand";
  $("call-form").requestSubmit();
}

async function retrieve(event) {
  event.preventDefault();
  clearOutput();
  document.body.dataset.state = "loading";
  history.replaceState(null, "", location.pathname);
  try {
    const response = await api("/v1/retrieve", { method: "POST", body: JSON.stringify(request()) });
    renderResponse(response);
    document.body.dataset.state = "done";
  } catch (error) {
    showError(error);
  }
}

function renderResponse(r) {
  const link = el("a", { href: `?call=${encodeURIComponent(r.call_id)}` }, "open this call later");
  const next = el("button", { type: "button", id: "next-page" }, "Next page");
  next.addEventListener("click", () => nextPage(r.continuation));
  show("summary",
    el("h2", null, "Call"),
    dl([
      ["call_id", el("span", { class: "mono" }, r.call_id)],
      ["mode", r.mode],
      ["partial", r.partial ? badge("partial: something degraded", "flag") : "no"],
      ["continuation", r.continuation],
    ]),
    r.continuation ? el("p", null, next) : null,
    el("p", { class: "note" }, link, " (its audited shape, and a deferred answer)"));
  renderRecord(r.record, (r.route || {}).resolve);
  renderSources(r);
  renderBudget(r.budget, (r.route || {}).budget);
  renderFunnel(r.trace, r.withheld);
  renderItems(r.sources);
  if (r.synthesis) renderSynthesis(r.synthesis, "synthesis", r.call_id);
  renderLayers(r.route || {});
  show("raw", el("details", null, el("summary", null, "The response as JSON"),
    el("pre", null, JSON.stringify(r, null, 2))));
}

function renderRecord(record, route) {
  const detail = (route && route.detail) || {};
  const parts = [el("h2", null, "Resolved record")];
  if (!record) {
    parts.push(el("p", null, detail.not_found || "No record: the call named none (an org-wide question)."));
  } else {
    parts.push(dl([
      ["id", el("span", { class: "mono" }, record.id)],
      ["kind", record.kind],
      ["tombstone", record.tombstone ? badge("tombstone", "tombstone") : "no"],
    ]));
    if (record.tombstone) {
      parts.push(el("p", { class: "note" }, "The record is pending deletion: the response carries its id and kind only, " +
        "and nothing attached to it."));
    }
    parts.push(el("h3", null, `Merged into it (${record.merged_from.length})`));
    parts.push(record.merged_from.length
      ? el("p", null, record.merged_from.map((id) => el("span", { class: "chip mono" }, id)),
        el("span", { class: "note" }, " records merged into this one: their memories count as its own."))
      : el("p", { class: "note" }, "none"));
    if (detail.merged_chain) parts.push(el("p", { class: "note" }, "merge chain followed: ", detail.merged_chain.join(" → ")));
    parts.push(el("h3", null, `Aliases (${record.aliases.length})`));
    parts.push(record.aliases.length
      ? el("p", null, record.aliases.map((id) => el("span", { class: "chip mono" }, id)),
        el("span", { class: "note" }, " why: other live records of the org that share this record's company " +
          "domain (the resolve layer's same-domain rule; free-mail domains never count; at most 20). Their " +
          "memories are recalled with the record's."))
      : el("p", { class: "note" }, "none"));
  }
  if (route && route.fallback_reason) parts.push(el("p", null, badge(route.fallback_reason, "flag"), " ", text(detail.alias_error)));
  if (detail.merge_error) parts.push(el("p", null, badge("merge_error", "flag"), " ", detail.merge_error));
  show("record", parts);
}

function routeList(route) {
  if (!route) return el("p", { class: "note" }, "no route reported");
  const pairs = [
    ["ran", route.ran ? "yes" : "no"],
    ["backend", route.backend],
    ["requested depth", route.requested_depth],
    ["effective depth", route.effective_depth],
    ["fallback", route.fallback_reason ? badge(route.fallback_reason, "flag") : "none"],
  ];
  for (const [name, value] of Object.entries(route.detail || {})) pairs.push([name, value]);
  return dl(pairs);
}

function renderSources(r) {
  const names = SOURCES.filter((s) => s in r.sources).concat(Object.keys(r.sources).filter((s) => !SOURCES.includes(s)));
  const cards = names.map((name) => {
    const s = r.sources[name];
    return el("div", { class: "card", dataset: { source: name, status: s.status } },
      el("h3", null, el("span", null, name), badge(s.status)),
      dl([
        ["items", s.items.length],
        ["bytes used", s.bytes_used],
        ["dropped", s.dropped],
        ["error", s.error ? el("span", { class: "text" }, s.error) : undefined],
      ]),
      el("h3", null, "route"),
      routeList((r.route || {})[name]));
  });
  show("sources", el("h2", null, "Sources"), el("div", { class: "cards" }, cards));
}

function renderBudget(budget, route) {
  if (!budget) return;
  const names = Object.keys(budget.share);
  const values = names.flatMap((n) => [budget.share[n] || 0, budget.used[n] || 0]);
  const scale = Math.max(budget.total_bytes, ...values, 1);
  const pct = (n) => `${((100 * n) / scale).toFixed(2)}%`;
  const rows = names.map((name) => {
    const share = budget.share[name] || 0;
    const used = budget.used[name] || 0;
    const dropped = (budget.dropped || {})[name] || 0;
    const shareBar = el("div", { class: "bar share" });
    shareBar.style.width = pct(share);
    const usedBar = el("div", { class: used > share ? "bar used over" : "bar used" });
    usedBar.style.width = pct(used);
    return el("div", { class: "bar-row", dataset: { source: name, share, used, dropped } },
      el("span", null, name),
      el("div", { class: "track" }, shareBar, usedBar),
      el("span", { class: "mono" }, `used ${used} of share ${share} B · dropped ${dropped}`));
  });
  const usedTotal = names.reduce((sum, n) => sum + (budget.used[n] || 0), 0);
  const planned = route && route.detail && route.detail.shares;
  show("budget-section",
    el("h2", null, `Budget: ${usedTotal} of ${budget.total_bytes} bytes used`),
    el("p", { class: "legend" }, el("span", { class: "swatch share" }), "share",
      el("span", { class: "swatch used" }), "used", el("span", { class: "swatch over" }), "used beyond its share"),
    rows,
    el("p", { class: "note" }, "Shares are of the whole budget, spread over the sources that have something; " +
      "what a source leaves unused goes to the others, so a source can use more than its share. " +
      "Dropped: items that did not fit."),
    planned ? el("p", { class: "note" }, "shares as planned by the budget layer: ", text(planned)) : null);
}

function renderFunnel(trace, withheld) {
  if (!trace && !withheld) {
    show("funnel", el("h2", null, "Evidence funnel"), el("p", { class: "note" }, "The response carries no trace."));
    return;
  }
  const layers = new Map();
  const layer = (name) => {
    if (!layers.has(name)) layers.set(name, { kept: 0, dropped: 0, withheld: 0, keptWhy: new Map(), droppedWhy: new Map(), sources: new Map() });
    return layers.get(name);
  };
  const bump = (map, k, n) => map.set(k, (map.get(k) || 0) + n);
  for (const t of trace || []) {
    const l = layer(t.layer);
    l[t.decision] += 1;
    bump(t.decision === "kept" ? l.keptWhy : l.droppedWhy, t.reason || (t.decision === "kept" ? "kept" : "dropped"), 1);
    bump(l.sources, `${t.source} ${t.decision}`, 1);
  }
  for (const [name, reasons] of Object.entries(withheld || {})) {
    const l = layer(name);
    for (const [reason, n] of Object.entries(reasons)) {
      l.withheld += n;
      bump(l.droppedWhy, `${reason} (withheld)`, n);
    }
  }
  const order = LAYERS.filter((n) => layers.has(n)).concat([...layers.keys()].filter((n) => !LAYERS.includes(n)));
  const scale = Math.max(1, ...order.map((n) => layers.get(n).kept + layers.get(n).dropped + layers.get(n).withheld));
  const chips = (map, cls) => [...map.entries()].map(([k, n]) => el("span", { class: `chip ${cls || ""}` }, `${k} ×${n}`));
  const rows = order.map((name) => {
    const l = layers.get(name);
    const bars = [["kept", l.kept], ["dropped", l.dropped], ["withheld", l.withheld]].map(([cls, n]) => {
      const bar = el("div", { class: `bar ${cls}` });
      bar.style.width = `${((100 * n) / scale).toFixed(2)}%`;
      return bar;
    });
    let left = 0;
    for (const bar of bars) { // stacked: kept, then dropped, then withheld
      bar.style.left = `${left}%`;
      left += parseFloat(bar.style.width);
    }
    const withheldWhy = new Map([...l.droppedWhy].filter(([k]) => k.endsWith("(withheld)")));
    const droppedWhy = new Map([...l.droppedWhy].filter(([k]) => !k.endsWith("(withheld)")));
    return el("tr", { dataset: { layer: name, kept: l.kept, dropped: l.dropped + l.withheld } },
      el("td", null, el("strong", null, name)),
      el("td", { class: "num" }, l.kept),
      el("td", { class: "num" }, l.dropped + l.withheld),
      el("td", null, el("div", { class: "track" }, bars)),
      el("td", null, chips(l.keptWhy), chips(droppedWhy), chips(withheldWhy, "withheld")),
      el("td", { class: "note" }, [...l.sources.entries()].map(([k, n]) => `${k} ${n}`).join(", ")));
  });
  show("funnel",
    el("h2", null, "Evidence funnel"),
    el("p", { class: "legend" }, el("span", { class: "swatch kept" }), "kept", el("span", { class: "swatch dropped" }),
      "dropped", el("span", { class: "swatch withheld" }), "dropped, not named to this caller: not visible to it, or dropped before governance cleared it (counted only)"),
    el("table", null,
      el("thead", null, el("tr", null, ["layer", "kept", "dropped", "", "why", "per source"].map((h, i) =>
        el("th", { class: i === 1 || i === 2 ? "num" : null }, h)))),
      el("tbody", null, rows)));
}

function sectionPath(item) {
  return [item.title, item.heading].filter(Boolean).join(" › ");
}

function itemRows(name, items) {
  const flag = (i) => (i.truncated ? badge("truncated", "flag") : "");
  if (name === "documents") {
    return table(["section path", "section id", "score", "confidence", "relevance", "", "text"], items.map((i) => [
      el("strong", null, sectionPath(i)), el("span", { class: "mono" }, i.section_id), score(i.score), i.confidence,
      i.relevance, flag(i), el("details", null, el("summary", null, "text"), el("div", { class: "text" }, i.text))]), [2]);
  }
  if (name === "memories") {
    return table(["id", "tier", "score", "created", "", "text"], items.map((i) => [
      el("span", { class: "mono" }, i.id), i.tier, score(i.score), i.created_at, flag(i), el("div", { class: "text" }, i.text)]), [2]);
  }
  if (name === "properties") {
    return table(["record", "name", "value", "matched", "score", ""], items.map((i) => [
      el("span", { class: "mono" }, i.record_id), i.name, el("div", { class: "text" }, text(i.value)),
      i.matched === null || i.matched === undefined ? "—" : String(i.matched), score(i.score), flag(i)]), [4]);
  }
  if (name === "graph") {
    return table(["id", "edge", "confidence", "weight", "hops"], items.map((i) => [
      el("span", { class: "mono" }, i.id), `${i.src} —${i.type}→ ${i.dst}`, score(i.confidence), score(i.weight), i.hops]), [2, 3, 4]);
  }
  return table(["source", "id", "score", "", "text"], items.map((i) => [
    i.source, el("span", { class: "mono" }, i.id), score(i.score), flag(i), el("div", { class: "text" }, i.text)]), [2]);
}

function renderItems(sources) {
  const parts = [el("h2", null, "Items")];
  for (const name of SOURCES.filter((s) => s in sources)) {
    const items = sources[name].items;
    parts.push(el("h3", null, `${name} (${items.length})`));
    parts.push(items.length ? el("div", { dataset: { items: name } }, itemRows(name, items)) : el("p", { class: "note" }, "none"));
  }
  show("items", parts);
}

function renderSynthesis(s, target, callId) {
  const parts = [el("h2", null, "Synthesis"), dl([
    ["pending", s.pending ? badge("pending", "flag") : "no"],
    ["answer", s.answer === null ? "—" : el("div", { class: "text" }, s.answer)],
    ["reasoning", s.reasoning === null ? undefined : el("div", { class: "text" }, s.reasoning)],
    ["confidence", s.confidence],
    ["sources used", (s.sources_used || []).join(", ") || "—"],
    ["citations", Object.keys(s.citations || {}).length ? s.citations : undefined],
    ["unknown citations", (s.unknown_citations || []).length ? s.unknown_citations.join(", ") : undefined],
    ["error", s.error ? el("span", { class: "text" }, s.error) : undefined],
    ["usage", s.usage || undefined],
  ])];
  if (s.pending && callId) {
    parts.push(el("p", null, el("button", { type: "button", id: "wait" }, "Wait up to 10 s for the answer")));
  }
  show(target, parts);
  const wait = $("wait");
  if (wait) wait.addEventListener("click", () => openCall(callId, 10));
}

function renderLayers(route) {
  const others = Object.keys(route).filter((n) => !SOURCES.includes(n));
  if (!others.length) return;
  show("layers", el("h2", null, "Other layers"),
    el("div", { class: "cards" }, others.map((n) => el("div", { class: "card", dataset: { layer: n } },
      el("h3", null, n), routeList(route[n])))));
}

// -- an earlier call -----------------------------------------------------------------------------------------
async function openCall(callId, wait) {
  clearOutput();
  if (!callId) {
    showError(new Failure(null, "Enter a call id."));
    return;
  }
  if (/[\/\\?#]/.test(callId) || /^\.{1,2}$/.test(callId)) {  // it would name another route, not a call
    showError(new Failure(null, "That is not a call id: a call id holds no '/', '\\', '?' or '#' and is not '.' or '..'."));
    return;
  }
  $("call-id").value = callId;
  history.replaceState(null, "", `?call=${encodeURIComponent(callId)}`);
  document.body.dataset.state = "loading";
  try {
    const suffix = wait ? `?wait=${wait}` : "";
    const found = await api(`/v1/calls/${encodeURIComponent(callId)}${suffix}`, { method: "GET" });
    renderCall(found);
    document.body.dataset.state = "done";
  } catch (error) {
    showError(error);
  }
}

function renderCall(c) {
  const s = c.summary || {};
  const shape = s.shape || {};
  const flags = Object.entries(shape).filter(([k]) => k !== "sources");
  const parts = [
    el("h2", null, "An earlier call"),
    el("p", { class: "note" }, "The service keeps a call's shape (sizes, statuses, flags), never its items or text; " +
      "a deferred answer is shown to the caller that made the call."),
    dl([
      ["call_id", el("span", { class: "mono" }, c.call_id)],
      ["status", badge(c.status, c.status === "ok" ? "ok" : "error")],
      ["caller", s.caller], ["front end", s.front_end], ["at", s.at], ["latency ms", s.latency_ms],
      ["mode", s.mode], ["depth", s.depth], ["error", s.error_type || undefined], ["units", s.units],
    ]),
    el("h3", null, "Shape"),
    dl(flags),
  ];
  if (shape.sources) {
    parts.push(el("h3", null, "Sources"));
    parts.push(el("div", { dataset: { shape: "sources" } }, table(["source", "status", "items", "bytes", "dropped", "error"],
      Object.entries(shape.sources).map(([name, v]) => [name, badge(v.status), v.items, v.bytes, v.dropped,
        v.error ? "yes" : "no"]), [2, 3, 4])));
  }
  show("call", parts);
  if (c.synthesis) renderSynthesis(c.synthesis, "synthesis", c.call_id);
  else if (shape.deferred) show("synthesis", el("h2", null, "Synthesis"), el("p", { class: "note" },
    c.status !== "ok" ? "The call failed before its synthesis ran: there is no answer to show."
      : "A deferred call of another caller of your org: its answer is theirs."));
}

// -- wiring ------------------------------------------------------------------------------------------------
function fillExample() {
  $("record-kind").value = EXAMPLE.kind;
  $("record-value").value = EXAMPLE.value;
  $("message").value = EXAMPLE.message;
  $("mode").value = EXAMPLE.mode;
  $("depth").value = EXAMPLE.depth;
  $("budget").value = String(EXAMPLE.budget);
}

document.addEventListener("DOMContentLoaded", () => {
  $("key").value = sessionStorage.getItem(KEY_STORE) || "";
  $("call-form").addEventListener("submit", retrieve);
  $("example").addEventListener("click", fillExample);
  $("forget").addEventListener("click", () => {
    sessionStorage.removeItem(KEY_STORE);
    $("key").value = "";
  });
  $("open-call").addEventListener("click", () => openCall($("call-id").value.trim(), 0));
  const callId = new URLSearchParams(location.search).get("call");
  if (callId) {
    $("call-id").value = callId;
    if ($("key").value) openCall(callId, 0);
    else showError(new Failure(null, "Enter your API key, then press Open call."));
  } else {
    document.body.dataset.state = "ready";
  }
});
