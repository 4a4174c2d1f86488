"""The report's output viewer (`viewer.html` next to report.md): one self-contained page — no network, no CDN —
in the spirit of SummVis (Vig et al. 2021). Per document: the source with the model's and the oracle's picked
sentences marked, every system's summary with the spans it copied from the source marked and its novel words
and bigrams shown, the reference, and per-document ROUGE per system; the table sorts on any column, filters on
text, and puts the worst documents first in one click.

What is computed here (Python) and what the page does (a small inline script): the marks, copied fragments and
per-document scores are computed once and embedded as JSON; the script only renders, sorts and filters.
Copied spans are Grusky et al.'s (2018) extractive fragments: greedy longest matches of the summary's lowercased
whitespace tokens in the source's, kept from `MIN_COPY` tokens up (shorter matches are mostly function words).
"""
from __future__ import annotations

import html
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

MIN_COPY = 3          # tokens: a shorter shared run is not counted as copied
VIEWER = "viewer.html"


def _words(text: str) -> list[str]:
    return text.split()


def copy_segments(summary: Sequence[str], source: Sequence[str]) -> list[list[list[Any]]]:
    """Per summary sentence, its tokens grouped into segments [text, kind], kind 'copy' (in a fragment of
    >= MIN_COPY tokens found in the source), 'novel' (a word the source never uses) or '' (neither)."""
    src = [w.lower() for s in source for w in _words(s)]
    src_vocab = set(src)
    positions: dict[str, list[int]] = {}
    for i, w in enumerate(src):
        positions.setdefault(w, []).append(i)
    out = []
    for sentence in summary:
        toks = _words(sentence)
        low = [t.lower() for t in toks]
        kinds = [""] * len(toks)
        i = 0
        while i < len(toks):   # Grusky et al.'s greedy fragments: the longest source match starting at i
            best = 0
            for j in positions.get(low[i], ()):
                n = 0
                while i + n < len(low) and j + n < len(src) and low[i + n] == src[j + n]:
                    n += 1
                best = max(best, n)
            if best >= MIN_COPY:
                kinds[i:i + best] = ["copy"] * best
                i += best
            else:
                if low[i] not in src_vocab:
                    kinds[i] = "novel"
                i += 1
        segments: list[list[Any]] = []
        for tok, kind in zip(toks, kinds):
            if segments and segments[-1][1] == kind:
                segments[-1][0] += " " + tok
            else:
                segments.append([tok, kind])
        out.append(segments)
    return out


def novel_bigrams(summary: Sequence[str], source: Sequence[str]) -> list[str]:
    """The summary's bigrams (within a sentence) that never occur in the source, in order, once each."""
    def grams(sentences):
        return [" ".join(g) for s in sentences for g in zip(_words(s.lower()), _words(s.lower())[1:])]
    seen, src, out = set(), set(grams(source)), []
    for g in grams(summary):
        if g not in src and g not in seen:
            seen.add(g)
            out.append(g)
    return out


def _picks(summary: Sequence[str], source: Sequence[str]) -> list[int] | None:
    """The source indices of an extract (every summary sentence is a source sentence), else None."""
    index = {s: i for i, s in reversed(list(enumerate(source)))}
    if not summary or any(s not in index for s in summary):
        return None
    return sorted(index[s] for s in summary)


def viewer_data(result: dict[str, Any], docs: Sequence[Any], meta: dict[str, Any]) -> dict[str, Any]:
    """What the page embeds: per document its source, marks, summaries with copied spans, reference, scores."""
    systems = list(result["summaries"])
    per_doc = result.get("per_document", {})
    rows = []
    for k, doc in enumerate(docs):
        entry = {"id": doc.doc_id, "source": list(doc.sentences), "reference": list(doc.references[0]),
                 "picks": {}, "systems": {}}
        for name in systems:
            summary = result["summaries"][name][k]
            picks = _picks(summary, doc.sentences)
            if picks is not None and name in ("model", "oracle"):
                entry["picks"][name] = picks
            entry["systems"][name] = {
                "segments": copy_segments(summary, doc.sentences) if picks is None else [[[s, "copy"]] for s in summary],
                "extract": picks is not None,
                "novel_bigrams": [] if picks is not None else novel_bigrams(summary, doc.sentences),
                "scores": {m: per_doc[name][m][k] for m in ("rouge1_f", "rouge2_f", "rougeL_f")
                           if name in per_doc and m in per_doc[name]}}
        rows.append(entry)
    title = f"{str(meta.get('task', 'extractive')).capitalize()} summaries on {meta.get('split', '?')}: " \
            f"{len(rows)} documents"
    return {"title": title, "systems": systems, "documents": rows,
            "meta": {k: v for k, v in meta.items() if isinstance(v, (str, int, float, bool)) or v is None}}


def write_viewer(out_dir: Path, result: dict[str, Any], docs: Sequence[Any], meta: dict[str, Any]) -> Path:
    data = viewer_data(result, docs, meta)
    # every "<" escaped: "</script>" would end the element early and "<!--" (scraped text) would change how the
    # parser reads it; JSON reads \u003c back as "<"
    payload = json.dumps(data, ensure_ascii=False).replace("<", "\\u003c")
    parts = {"__TITLE__": html.escape(data["title"]), "__DATA__": payload}
    page = re.sub("__TITLE__|__DATA__", lambda m: parts[m.group(0)], _PAGE)  # one pass: no value is re-read
    path = Path(out_dir) / VIEWER
    path.write_text(page, encoding="utf-8")
    return path


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>__TITLE__</title>
<style>
body{font:14px/1.45 system-ui,sans-serif;margin:1.2em;color:#222}
h1{font-size:1.25em} .meta{color:#555;font-size:.9em}
#controls{margin:.8em 0} #controls input{width:24em;padding:.25em}
table{border-collapse:collapse;width:100%} th,td{border-bottom:1px solid #ddd;padding:.3em .5em;text-align:left}
th{cursor:pointer;background:#f4f4f4;position:sticky;top:0} th.sorted{background:#e2e8f0}
tr.doc{cursor:pointer} tr.doc:hover{background:#f7fafc} td.num{text-align:right;font-variant-numeric:tabular-nums}
tr.detail>td{background:#fbfbfb;padding:.8em 1.2em} tr.detail.hidden{display:none}
.cols{display:flex;gap:2em} .cols>div{flex:1;min-width:0}
.sent{margin:.15em 0;padding:.05em .3em;border-left:4px solid transparent}
.pick-model{background:#dbeafe;border-left-color:#2563eb} .pick-oracle{border-left-color:#16a34a}
.pick-model.pick-oracle{background:#dcfce7}
mark.copy{background:#fde68a} span.novel{color:#b91c1c;font-weight:600}
.legend span{margin-right:1.2em} .tag{font-size:.8em;color:#555}
</style></head><body>
<h1 id="title">__TITLE__</h1>
<div class="meta" id="meta"></div>
<div class="legend"><span class="sent pick-model">model's pick</span><span class="sent pick-oracle">oracle's pick</span>
<span><mark class="copy">copied from the source</mark></span><span><span class="novel">novel word</span></span></div>
<div id="controls"><input id="filter" placeholder="filter: id or any text"> <button id="worst">worst first</button>
<span id="count"></span></div>
<table id="docs"><thead><tr id="head"></tr></thead><tbody id="rows"></tbody></table>
<script type="application/json" id="data">__DATA__</script>
<script>
"use strict";
const D = JSON.parse(document.getElementById("data").textContent);
const M = [["rouge1_f","R1"],["rouge2_f","R2"],["rougeL_f","RL"]];
const el = (tag, cls, text) => {const e = document.createElement(tag); if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text; return e;};
document.getElementById("meta").textContent = Object.entries(D.meta).map(([k,v]) => k + ": " + v).join(" | ");
const cols = [{key: "id", label: "document", get: d => d.id}];
for (const s of D.systems) for (const [m, l] of M)
  cols.push({key: s + ":" + m, label: s + " " + l, num: true, get: d => (d.systems[s].scores[m] ?? NaN)});
let sortKey = null, sortAsc = true;
const head = document.getElementById("head");
cols.forEach(c => {const th = el("th", "", c.label); th.dataset.key = c.key;
  th.onclick = () => {sortAsc = sortKey === c.key ? !sortAsc : !c.num; sortKey = c.key; render();}; head.appendChild(th);});
function source(d) {
  const box = el("div"); box.appendChild(el("h4", "", "source (" + d.source.length + " sentences)"));
  d.source.forEach((s, i) => {const p = el("div", "sent", s);
    for (const [who, idx] of Object.entries(d.picks)) if (idx.includes(i)) p.classList.add("pick-" + who);
    box.appendChild(p);});
  return box;
}
function summaries(d) {
  const box = el("div");
  for (const s of D.systems) {
    const sys = d.systems[s]; const sc = M.map(([m, l]) => l + " " + (sys.scores[m] ?? NaN).toFixed(1)).join(" ");
    box.appendChild(el("h4", "", s + (sys.extract ? " (extract)" : " (abstract)")));
    box.appendChild(el("div", "tag", sc));
    for (const sent of sys.segments) {const p = el("div", "sent");
      for (const [text, kind] of sent) {
        if (p.childNodes.length) p.appendChild(document.createTextNode(" "));
        p.appendChild(kind === "copy" && !sys.extract ? el("mark", "copy", text) : kind === "novel" ? el("span", "novel", text)
                      : document.createTextNode(text));}
      box.appendChild(p);}
    if (sys.novel_bigrams.length) box.appendChild(el("div", "tag", "novel bigrams: " + sys.novel_bigrams.join(" · ")));
  }
  box.appendChild(el("h4", "", "reference"));
  d.reference.forEach(s => box.appendChild(el("div", "sent", s)));
  return box;
}
function render() {
  const q = document.getElementById("filter").value.toLowerCase();
  let docs = D.documents.filter(d => !q || d.id.toLowerCase().includes(q) ||
    d.source.join(" ").toLowerCase().includes(q) || d.reference.join(" ").toLowerCase().includes(q));
  if (sortKey) {const c = cols.find(c => c.key === sortKey);
    docs = docs.slice().sort((a, b) => {const x = c.get(a), y = c.get(b);
      const r = c.num ? (isNaN(x) ? 1 : isNaN(y) ? -1 : x - y) : String(x).localeCompare(String(y));
      return sortAsc ? r : -r;});}
  for (const th of head.children) th.classList.toggle("sorted", th.dataset.key === sortKey);
  const body = document.getElementById("rows"); body.replaceChildren();
  for (const d of docs) {
    const tr = el("tr", "doc"); tr.dataset.id = d.id;
    cols.forEach(c => {const v = c.get(d); tr.appendChild(el("td", c.num ? "num" : "", c.num ? v.toFixed(2) : v));});
    const detail = el("tr", "detail hidden"); const td = el("td"); td.colSpan = cols.length;
    detail.appendChild(td);
    // built on first open: a test split of thousands of documents renders its table at once
    detail.open = () => {if (!td.firstChild) {const wrap = el("div", "cols"); wrap.appendChild(source(d));
      wrap.appendChild(summaries(d)); td.appendChild(wrap);} detail.classList.toggle("hidden");};
    tr.onclick = detail.open;
    body.appendChild(tr); body.appendChild(detail);
  }
  document.getElementById("count").textContent = docs.length + " of " + D.documents.length + " documents";
}
function worstFirst() {sortKey = "model:rouge1_f"; sortAsc = true;
  if (!D.systems.includes("model")) sortKey = cols[1] ? cols[1].key : null; render();}
document.getElementById("filter").oninput = render;
document.getElementById("worst").onclick = worstFirst;
// #worst sorts worst-first on load; #open=N expands the N-th row shown (links and screenshots)
const hash = new URLSearchParams(location.hash.slice(1));
if (hash.has("worst")) worstFirst(); else render();
if (hash.has("open")) {const rows = document.querySelectorAll("tr.detail"); const n = +hash.get("open");
  if (rows[n]) rows[n].open();}
</script></body></html>
"""
