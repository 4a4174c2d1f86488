"""The report's output viewer (`viewer.html` next to report.md): one self-contained page — no network, no CDN —
in the spirit of SummVis (Vig et al. 2021). Per document: the source with the model's and the oracle's picked
sentences marked, every system's summary with the spans it copied from the source marked and its novel words
and bigrams shown, the reference, and per-document ROUGE per system; the table sorts on any column, filters on
text, and puts the worst documents first in one click.

What is computed here (Python) and what the page does (a small inline script): the marks, copied fragments and
per-document scores are computed once and embedded as JSON; the script only renders, sorts and filters.
Copied spans are Grusky et al.'s (2018) extractive fragments: greedy longest matches of the summary's tokens in
the source's, kept from `MIN_COPY` tokens up (shorter matches are mostly function words). Tokens (`tokens`, also
the novel n-grams of `abstractive.metrics`) are words and punctuation marks apart (`\\w+|[^\\w\\s]`, so "budget."
is "budget" "."), lowercased and NFKC-normalised: a decoder's text is SentencePiece's nmt_nfkc form ("ﬁ" -> "fi",
"½" -> "1⁄2"), its source is not. The page shows the original text: each token keeps the span it came from.
"""
from __future__ import annotations

import html
import json
import re
import unicodedata
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hibert.finetune.base.selection import oracle_from_labels

MIN_COPY = 3          # tokens: a shorter shared run is not counted as copied
VIEWER = "viewer.html"
_TOKEN = re.compile(r"\w+|[^\w\s]")


def _normalised(text: str) -> tuple[str, list[tuple[int, int]]]:
    """NFKC + lowercase of `text`, and for each of its characters the span of `text` it comes from. Normalised
    per base character with its combining marks (so "e" + U+0301 composes to "é"), which keeps the spans."""
    norm: list[str] = []
    spans: list[tuple[int, int]] = []
    start = 0
    for i in range(1, len(text) + 1):
        if i < len(text) and unicodedata.category(text[i])[0] == "M":
            continue                              # a combining mark stays with the character before it
        piece = unicodedata.normalize("NFKC", text[start:i]).lower()
        norm.append(piece)
        spans += [(start, i)] * len(piece)
        start = i
    return "".join(norm), spans


def _is_mark(c: str) -> bool:
    return unicodedata.category(c)[0] == "M"


def tokens(text: str) -> list[tuple[str, int, int]]:
    """The tokens of `text` that summaries and sources are matched on, each with the span of `text` it shows as.
    Tokens that come from one character ("2½" -> "21" "⁄" "2") share one span (the union of theirs)."""
    if text.isascii():                            # the common case: NFKC changes nothing
        return [(m.group().lower(), m.start(), m.end()) for m in _TOKEN.finditer(text)]
    norm, spans = _normalised(text)
    cuts: list[tuple[int, int]] = []
    for m in _TOKEN.finditer(norm):             # \w has no combining marks: a word's marks join it ("हिन्दी", "i̇")
        c = norm[m.start()]
        if cuts and cuts[-1][1] == m.start() and (_is_mark(c) or (_is_mark(norm[m.start() - 1]) and c.isalnum())):
            cuts[-1] = (cuts[-1][0], m.end())
        else:
            cuts.append((m.start(), m.end()))
    out = [(norm[a:b], spans[a][0], spans[b - 1][1]) for a, b in cuts]
    for k in range(len(out) - 1, 0, -1):          # overlapping spans -> one display unit
        (t0, s0, e0), (t1, s1, e1) = out[k - 1], out[k]
        if s1 < e0:
            out[k - 1] = (t0, s0, max(e0, e1))
    for k in range(1, len(out)):
        (t0, s0, e0), (t1, s1, e1) = out[k - 1], out[k]
        if s1 < e0:
            out[k] = (t1, s0, e0)
    return out


def _segments(sentence: str, toks: list[tuple[str, int, int]], kinds: list[str]) -> list[list[Any]]:
    """`sentence` cut into [text, kind] pieces that join back to it exactly (whitespace included): a display unit
    is 'copy' if any of its tokens is copied, else 'novel' if any is novel."""
    units: list[tuple[int, int, str]] = []
    for (_, s, e), kind in zip(toks, kinds):
        if units and units[-1][:2] == (s, e):
            prev = units[-1][2]
            kind = "copy" if "copy" in (prev, kind) else "novel" if "novel" in (prev, kind) else ""
            units[-1] = (s, e, kind)
        else:
            units.append((s, e, kind))
    segments: list[list[Any]] = []

    def add(text: str, kind: str) -> None:
        if not text:
            return
        if segments and segments[-1][1] == kind:
            segments[-1][0] += text
        else:
            segments.append([text, kind])

    pos = 0
    for s, e, kind in units:
        # the space between two tokens of one fragment is inside its mark; any other is plain
        add(sentence[pos:s], kind if segments and segments[-1][1] == kind else "")
        add(sentence[s:e], kind)
        pos = e
    add(sentence[pos:], "")
    return segments


def copy_segments(summary: Sequence[str], source: Sequence[str]) -> list[list[list[Any]]]:
    """Per summary sentence, its text cut into segments [text, kind], kind 'copy' (in a fragment of
    >= MIN_COPY tokens found in the source), 'novel' (a token the source never uses) or '' (neither); the
    segments of a sentence join back to it."""
    src = [t for s in source for t, _, _ in tokens(s)]
    src_vocab = set(src)
    positions: dict[str, list[int]] = {}
    for i, w in enumerate(src):
        positions.setdefault(w, []).append(i)
    out = []
    for sentence in summary:
        toks = tokens(sentence)
        low = [t for t, _, _ in toks]
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
        out.append(_segments(sentence, toks, kinds))
    return out


def novel_bigrams(summary: Sequence[str], source: Sequence[str]) -> list[str]:
    """The summary's bigrams (within a sentence) that never occur in the source, in order, once each."""
    def grams(sentences: Sequence[str]) -> list[str]:
        out = []
        for s in sentences:
            toks = [t for t, _, _ in tokens(s)]
            out += [" ".join(g) for g in zip(toks, toks[1:])]
        return out
    seen, src, out = set(), set(grams(source)), []
    for g in grams(summary):
        if g not in src and g not in seen:
            seen.add(g)
            out.append(g)
    return out


def _picks(summary: Sequence[str], source: Sequence[str], given: Sequence[int] | None = None) -> list[int] | None:
    """The source indices of an extract (every summary sentence is a source sentence), else None. `given`: the
    indices the system selected, used when they hold the summary's sentences. Otherwise a sentence the source
    repeats ("Scroll down for video.") is placed: an extract lists its sentences in document order, so each takes
    the first occurrence after the one before; failing that, an occurrence not yet taken."""
    if not summary:
        return None
    if given is not None and len(given) == len(summary) and \
            all(0 <= j < len(source) and source[j] == s for j, s in zip(given, summary)):
        return sorted(int(j) for j in given)
    where: dict[str, list[int]] = {}
    for i, s in enumerate(source):
        where.setdefault(s, []).append(i)
    if any(s not in where for s in summary):
        return None
    picks: list[int] = []
    for s in summary:
        after = [i for i in where[s] if not picks or i > picks[-1]]
        if not after:
            break
        picks.append(after[0])
    else:
        return picks
    taken: list[int] = []
    for s in summary:
        free = [i for i in where[s] if i not in taken]
        taken.append(free[0] if free else where[s][0])
    return sorted(set(taken))


def meta_text(value: Any) -> str:
    """A meta value as a reader reads it: on/off, none, a list joined by commas, a dict as `key value` pairs."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if value is None:
        return "none"
    if isinstance(value, dict):
        return ", ".join(f"{k} {meta_text(v)}" for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return ", ".join(meta_text(v) for v in value)
    return str(value)


def viewer_data(result: dict[str, Any], docs: Sequence[Any], meta: dict[str, Any]) -> dict[str, Any]:
    """What the page embeds: per document its source, marks, summaries with copied spans, reference, scores;
    the meta's notes (shown first), the marks the legend explains (only those the page shows), the first
    sentences the model reads (`reads_sentences` in the meta: later ones are greyed) and the picked positions."""
    systems = list(result["summaries"])
    per_doc = result.get("per_document", {})
    rows = []
    for k, doc in enumerate(docs):
        # every reference: a document with several scores the best of them (rouge.py), so all are shown
        entry = {"id": doc.doc_id, "source": list(doc.sentences), "references": [list(r) for r in doc.references],
                 "picks": {}, "systems": {}}
        for name in systems:
            summary = result["summaries"][name][k]
            given = result.get("picks", {}).get(name)
            given = given[k] if given is not None else None
            if given is None and name == "oracle" and getattr(doc, "labels", None) is not None:
                given = oracle_from_labels(doc.labels)   # the oracle's own choice among repeated sentences
            picks = _picks(summary, doc.sentences, given)
            if picks is not None and name in ("model", "oracle"):
                entry["picks"][name] = picks
            entry["systems"][name] = {
                "segments": copy_segments(summary, doc.sentences) if picks is None else [[[s, "copy"]] for s in summary],
                "extract": picks is not None,
                "novel_bigrams": [] if picks is not None else novel_bigrams(summary, doc.sentences),
                "scores": {m: per_doc[name][m][k] for m in ("rouge1_f", "rouge2_f", "rougeL_f")
                           if name in per_doc and m in per_doc[name]}}
        rows.append(entry)
    title = f"{str(meta.get('task', 'summarization')).capitalize()} summaries on {meta.get('split', '?')}: " \
            f"{len(rows)} documents"
    # the legend explains the marks this page shows: copied spans and novel words where a system writes its own
    # words, a system's picked sentences where its summary is an extract of the source
    legend = {"copy": any(not e["systems"][s]["extract"] for e in rows for s in systems),
              **{f"pick-{who}": any(who in e["picks"] for e in rows) for who in ("model", "oracle")}}
    reads = meta.get("reads_sentences")
    return {"title": title, "systems": systems, "documents": rows,
            "notes": [str(n) for n in meta.get("notes") or []], "legend": legend,
            "reads_sentences": reads if isinstance(reads, int) and not isinstance(reads, bool) and reads > 0 else None,
            "positions": result.get("positions") or {},
            "meta": {k: meta_text(v) for k, v in meta.items()   # notes above it; `reads` says reads_sentences
                     if k != "notes" and not (isinstance(v, (list, tuple, dict)) and not v)
                     and not (k == "reads_sentences" and "reads" in meta)}}


def write_viewer(out_dir: Path, result: dict[str, Any], docs: Sequence[Any], meta: dict[str, Any]) -> Path:
    data = viewer_data(result, docs, meta)
    # every "<" escaped: "</script>" would end the element early and "<!--" (scraped text) would change how the
    # parser reads it; JSON reads \u003c back as "<"
    payload = json.dumps(data, ensure_ascii=False).replace("<", "\\u003c")
    # the notes are in the page itself, first: they read without the script
    notes = "".join(f'<p><strong>Note:</strong> {html.escape(n)}</p>' for n in data["notes"])
    parts = {"__TITLE__": html.escape(data["title"]), "__DATA__": payload, "__NOTES__": notes}
    page = re.sub("__TITLE__|__DATA__|__NOTES__", lambda m: parts[m.group(0)], _PAGE)  # one pass: no value is re-read
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
tr.doc>td:first-child::before{content:"▸ ";color:#64748b} tr.doc[data-open]>td:first-child::before{content:"▾ "}
.notes:empty{display:none} .notes{background:#fef3c7;border:1px solid #f59e0b;border-left:6px solid #d97706;
  padding:.3em 1em;margin:.6em 0 1em;font-size:1.02em} .notes p{margin:.45em 0}
.hint{color:#334155;margin:.4em 0 .6em} .sent.unread{color:#9ca3af} .unread-note{color:#6b7280;font-style:italic;
  border-top:1px dashed #9ca3af;margin:.5em 0 .2em;padding-top:.2em;font-size:.9em}
table.positions{width:auto;margin:.6em 0;font-size:.9em} table.positions th{cursor:default;position:static}
table.positions td{text-align:right;font-variant-numeric:tabular-nums} table.positions caption{text-align:left;color:#555;white-space:nowrap}
tr.detail>td{background:#fbfbfb;padding:.8em 1.2em} tr.detail.hidden{display:none}
.cols{display:flex;gap:2em} .cols>div{flex:1;min-width:0}
.sent{margin:.15em 0;padding:.05em .3em;border-left:4px solid transparent}
.pick-model{background:#dbeafe;border-left-color:#2563eb} .pick-oracle{border-left-color:#16a34a}
.pick-model.pick-oracle{background:#dcfce7}
mark.copy{background:#fde68a} span.novel{color:#b91c1c;font-weight:600}
.legend span{margin-right:1.2em} .tag{font-size:.8em;color:#555}
</style></head><body>
<h1 id="title">__TITLE__</h1>
<div class="notes" id="notes">__NOTES__</div>
<div class="meta" id="meta"></div>
<div id="positions"></div>
<div class="legend" id="legend"></div>
<div id="controls"><input id="filter" placeholder="filter: id, source, summaries or reference">
<button id="worst">worst first</button>
<span id="count"></span></div>
<p class="hint" id="hint">Click a row to open its document: the source, every system's summary and the reference.
Click a column heading to sort by it (again to reverse).</p>
<table id="docs"><thead><tr id="head"></tr></thead><tbody id="rows"></tbody></table>
<script type="application/json" id="data">__DATA__</script>
<script>
"use strict";
const D = JSON.parse(document.getElementById("data").textContent);
const M = [["rouge1_f","R1"],["rouge2_f","R2"],["rougeL_f","RL"]];
const el = (tag, cls, text) => {const e = document.createElement(tag); if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text; return e;};
document.getElementById("meta").textContent = Object.entries(D.meta).map(([k,v]) => k + ": " + v).join(" | ");
// the legend: only the marks this page shows
const legend = document.getElementById("legend"), L = D.legend || {};
const legendKey = (cls, text, tag) => {const s = el("span"); s.appendChild(el(tag || "span", cls, text)); legend.appendChild(s);};
if (L["pick-model"]) legendKey("sent pick-model", "model's pick");
if (L["pick-oracle"]) legendKey("sent pick-oracle", "oracle's pick");
if (L.copy) {legendKey("copy", "copied from the source", "mark"); legendKey("novel", "novel word");}
if (D.reads_sentences) legendKey("sent unread", "not read by the model (after its first " + D.reads_sentences + " sentences)");
// where the picked sentences sit in the document: % of each system's picks at sentence 1, 2, ..., 10+
if (D.positions && D.positions.systems) {
  const shown = ["model", "oracle"].filter(s => D.positions.systems[s]);
  if (shown.length) {
    const t = el("table", "positions"); t.appendChild(el("caption", "", "picked sentence position: % of each " +
      "system's picks (Lead-3 takes 1, 2, 3)"));
    const hr = el("tr"); hr.appendChild(el("th", "", "position")); D.positions.bins.forEach(b => hr.appendChild(el("th", "", b)));
    t.appendChild(hr);
    for (const s of shown) {const h = D.positions.systems[s], r = el("tr");
      r.appendChild(el("th", "", s + " (" + h.picks + " picks)"));
      h.share.forEach(x => r.appendChild(el("td", "", (100 * x).toFixed(0)))); t.appendChild(r);}
    document.getElementById("positions").appendChild(t);
  }
}
const cols = [{key: "id", label: "document", get: d => d.id}];
for (const s of D.systems) for (const [m, l] of M)
  cols.push({key: s + ":" + m, label: s + " " + l, num: true, get: d => (d.systems[s].scores[m] ?? NaN)});
let sortKey = null, sortAsc = true;
const head = document.getElementById("head");
cols.forEach(c => {const th = el("th", "", c.label); th.dataset.key = c.key; th.title = "sort by " + c.label;
  th.onclick = () => {sortAsc = sortKey === c.key ? !sortAsc : !c.num; sortKey = c.key; render();}; head.appendChild(th);});
function source(d) {
  // the model reads the first D.reads_sentences sentences (the data's limit): the rest is greyed, with a note
  const n = D.reads_sentences, cut = n && d.source.length > n;
  const box = el("div"); box.appendChild(el("h4", "", "source (" + d.source.length + " sentences" +
    (cut ? "; the model reads the first " + n : "") + ")"));
  d.source.forEach((s, i) => {
    if (cut && i === n) box.appendChild(el("div", "unread-note", "not read by the model: sentences " + (n + 1) +
      "\u2013" + d.source.length + " lie beyond the first " + n + " it reads (the data's limit); the baselines see " +
      "the whole document"));
    const p = el("div", cut && i >= n ? "sent unread" : "sent", s);
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
      for (const [text, kind] of sent) {  // the segments join back to the sentence, spaces included
        p.appendChild(kind === "copy" && !sys.extract ? el("mark", "copy", text) : kind === "novel" ? el("span", "novel", text)
                      : document.createTextNode(text));}
      box.appendChild(p);}
    if (sys.novel_bigrams.length) box.appendChild(el("div", "tag", "novel bigrams: " + sys.novel_bigrams.join(" · ")));
  }
  d.references.forEach((ref, i) => {
    box.appendChild(el("h4", "", d.references.length > 1 ? `reference ${i + 1} of ${d.references.length}` : "reference"));
    ref.forEach(s => box.appendChild(el("div", "sent", s)));
  });
  return box;
}
// what the filter searches: the id, the source, every system's summary and the reference (built once per document)
const haystack = d => d._haystack ??= [d.id, ...d.source, ...d.references.flat(),
  ...D.systems.map(s => d.systems[s].segments.map(sent => sent.map(([t]) => t).join("")).join(" "))]
  .join(" ").toLowerCase();
// ids sort as people read them ("test.jsonl:2" before "test.jsonl:10"); a missing score (NaN) is last both ways
const order = (c, asc) => (a, b) => {const x = c.get(a), y = c.get(b);
  if (c.num && (isNaN(x) || isNaN(y))) return isNaN(x) - isNaN(y);
  const r = c.num ? x - y : String(x).localeCompare(String(y), undefined, {numeric: true});
  return asc ? r : -r;};
function render() {
  const q = document.getElementById("filter").value.toLowerCase();
  let docs = D.documents.filter(d => !q || haystack(d).includes(q));
  if (sortKey) docs = docs.slice().sort(order(cols.find(c => c.key === sortKey), sortAsc));
  for (const [i, th] of [...head.children].entries()) {const on = th.dataset.key === sortKey;
    th.classList.toggle("sorted", on); th.textContent = cols[i].label + (on ? (sortAsc ? " \u25B2" : " \u25BC") : "");}
  const body = document.getElementById("rows"); body.replaceChildren();
  for (const d of docs) {
    const tr = el("tr", "doc"); tr.dataset.id = d.id;
    cols.forEach(c => {const v = c.get(d); tr.appendChild(el("td", c.num ? "num" : "", c.num ? v.toFixed(2) : v));});
    const detail = el("tr", "detail hidden"); const td = el("td"); td.colSpan = cols.length;
    detail.appendChild(td);
    // built on first open: a test split of thousands of documents renders its table at once
    detail.open = () => {if (!td.firstChild) {const wrap = el("div", "cols"); wrap.appendChild(source(d));
      wrap.appendChild(summaries(d)); td.appendChild(wrap);} detail.classList.toggle("hidden");
      tr.toggleAttribute("data-open", !detail.classList.contains("hidden"));};
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
