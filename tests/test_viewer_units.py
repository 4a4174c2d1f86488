"""The output viewer and the report's document grouping on hand-checked cases: tokens that split punctuation
off and match NFKC forms while the original text is shown, picks among repeated sentences, the page's sorting
and filtering in a real browser, and documents without a reference summary."""
import html
import json
import logging
from types import SimpleNamespace

import numpy as np
import pytest

from conftest import render_in_chromium
from hibert.errors import UserError
from hibert.finetune.evaluation.report import Document, documents, recording_left_out, score_systems
from hibert.finetune.evaluation.viewer import _picks, copy_segments, novel_bigrams, tokens, viewer_data, write_viewer

SOURCE = ["The council approved the budget on Monday, officials said.", "It funds three new schools in the city."]
SUMMARY = ["The council approved the budget.", "Three new schools in the city will be funded."]


def test_punctuation_is_its_own_token_and_segments_join_back_to_the_text():
    """'budget.' is 'budget' '.': 'the council approved the budget' (5 tokens) is a source run, '.' is a word the
    source has; 'will be funded' are the only words it lacks."""
    segments = copy_segments(SUMMARY, SOURCE)
    assert segments == [[["The council approved the budget", "copy"], [".", ""]],
                        [["Three new schools in the city", "copy"], [" ", ""], ["will be funded", "novel"], [".", ""]]]
    assert ["".join(t for t, _ in sent) for sent in segments] == SUMMARY
    assert novel_bigrams(SUMMARY, SOURCE) == ["budget .", "city will", "will be", "be funded", "funded ."]


def test_nfkc_forms_match_and_the_original_text_keeps_its_spans():
    """SentencePiece's nmt_nfkc output of a verbatim copy ('ﬁ' -> 'fi', '2½' -> '21⁄2', no-break space -> space)
    is all copied; tokens from one source character share its span; a combining accent stays in its word."""
    source = ["The ﬁnal bill was 2½ million for the\u00a0Office."]
    decoded = ["The final bill was 21⁄2 million for the Office."]
    assert copy_segments(decoded, source) == [[[decoded[0], "copy"]]]
    assert tokens("2½ ﬁnal") == [("21", 0, 2), ("⁄", 0, 2), ("2", 0, 2), ("final", 3, 7)]
    assert tokens("Cafe\u0301.") == [("café", 0, 5), (".", 5, 6)]
    # scripts whose letters carry combining marks (not in \w): the word stays one token, the full stop apart
    assert tokens("हिन्दी भाषा.") == [("हिन्दी", 0, 6), ("भाषा", 7, 11), (".", 11, 12)]


def test_picks_among_repeated_sentences():
    src = ["Scroll down for video.", "A fire broke out.", "Two were hurt.", "Scroll down for video."]
    assert _picks([src[1], src[3]], src) == [1, 3]           # in document order: the copy after the fire
    assert _picks([src[3], src[0]], src) == [0, 3]           # out of order: each takes an unused copy
    assert _picks([src[3]], src, given=[3]) == [3]           # the system's own indices win
    assert _picks([src[1]], src, given=[2]) == [1]           # ... when they hold its sentences
    docs = [Document("d", src, [["ref"]], np.array([0, 0, 1, 1]))]
    result = {"summaries": {"model": [[src[3]]], "oracle": [[src[2], src[3]]]}, "picks": {"model": [[3]]}}
    picks = viewer_data(result, docs, {})["documents"][0]["picks"]
    assert picks == {"model": [3], "oracle": [2, 3]}


# run in the page after it rendered: the row order after each action, then the first row opened
PROBE = """
const ids = () => [...document.querySelectorAll("tr.doc")].map(r => r.dataset.id).join(",");
const th = k => document.querySelector(`th[data-key="${k}"]`), out = [];
th("id").click(); out.push(ids());
th("model:rouge1_f").click(); out.push(ids());
th("model:rouge1_f").click(); out.push(ids());
th("id").click(); out.push(ids());
document.querySelector("tr.detail").open();
out.push(document.querySelector("tr.detail .sent mark").parentNode.innerHTML);
out.push([...document.querySelectorAll("tr.detail h4")].map(h => h.textContent).filter(t => t.startsWith("ref")));
const f = document.getElementById("filter"); f.value = "ZEBRA"; f.oninput(); out.push(ids());
const pre = el("pre", "", out.join("|")); pre.id = "probe"; document.body.appendChild(pre);
</script></body>"""


def test_page_sorts_ids_naturally_puts_missing_scores_last_and_filters_summaries(tmp_path):
    ids = ["test.jsonl:10", "test.jsonl:9", "test.jsonl:100", "test.jsonl:2"]
    docs = [Document(i, SOURCE, [["A reference."], ["Another one."]], None) for i in ids]   # scored on the best
    model = [SUMMARY, SUMMARY, ["A zebra crossing."], SUMMARY]
    r1 = [30.0, None, 10.0, 20.0]                            # no score for test.jsonl:9
    result = {"summaries": {"model": model},
              "per_document": {"model": {"rouge1_f": r1, "rouge2_f": r1, "rougeL_f": r1}}}
    page = write_viewer(tmp_path, result, docs, {"split": "test"})
    page.write_text(page.read_text().replace("</script></body>", PROBE))
    dom = render_in_chromium(page)
    probe = html.unescape(dom.split('<pre id="probe">', 1)[1].split("</pre>", 1)[0]).split("|")
    assert probe == ["test.jsonl:2,test.jsonl:9,test.jsonl:10,test.jsonl:100",      # id, ascending
                     "test.jsonl:10,test.jsonl:2,test.jsonl:100,test.jsonl:9",      # R1 descending, missing last
                     "test.jsonl:100,test.jsonl:2,test.jsonl:10,test.jsonl:9",      # R1 ascending, missing last
                     "test.jsonl:2,test.jsonl:9,test.jsonl:10,test.jsonl:100",
                     # the summary as written (no space put before the full stop), its copied run marked
                     '<mark class="copy">The council approved the budget</mark>.',
                     "reference 1 of 2,reference 2 of 2",                           # every reference shown
                     "test.jsonl:100"]                                              # found in its summary only


class _Split:
    split = "test"
    rows = [("d1", ["s1."], ["ref."]), ("d2", ["s2."], None), ("d3", ["s3."], [])]

    def __init__(self, rows=None):
        self.rows = rows or self.rows

    def __len__(self):
        return len(self.rows)

    def source_doc(self, i):
        return self.rows[i][0]

    def summary_text(self, i):
        return self.rows[i][2]

    def sentences_text(self, i):
        return self.rows[i][1]

    def labels(self, i):
        return None


def test_documents_without_a_summary_are_counted_logged_and_recorded(caplog):
    with caplog.at_level(logging.WARNING, "hibert.evaluate"), recording_left_out() as left_out:
        docs = documents(_Split())
    assert [d.doc_id for d in docs] == ["d1"] and left_out == {"test": ["d2", "d3"]}
    assert "2 of 3 documents of split test have no reference summary" in caplog.text
    with pytest.raises(UserError, match="none of the 2 documents of split test has a reference summary"):
        documents(_Split(_Split.rows[1:]))
    with pytest.raises(UserError, match="no documents to score"):
        score_systems([], {"model": []}, n_resamples=10)


def test_the_evaluation_records_left_out_documents_and_model_picks_and_refuses_a_baseline_name(tmp_path):
    """The skeleton on a stub head: the count of documents left out in the report meta, the head's own picks
    in the viewer, and `--compare tfidf=...` (the name of one of its baselines) refused before any prediction."""
    from hibert.finetune.evaluation.skeleton import SummaryEvaluation
    from hibert.finetune.evaluation.report import baseline_systems

    source = ["Same.", "Other.", "Same."]

    class Stub(SummaryEvaluation):
        predicted = False

        def load(self):
            return None, {}

        def view(self):
            return documents(_Split([("d1", source, ["Same."]), ("d2", ["x."], None)]))

        def baselines(self, docs):
            return {**baseline_systems(docs), "tfidf": [["Other."]]}

        def predict(self, docs):
            self.predicted, self.model_picks = True, [[2]]
            return [["Same."]]

        def report_meta(self, compared_with):
            return {"split": "test"}

    def stub(compare):
        settings = SimpleNamespace(compare=compare, split="test", bootstrap=10,
                                   report_dir=lambda run: tmp_path / "report")
        return Stub(SimpleNamespace(run_dir=tmp_path), settings, tmp_path, "ref")

    out = stub([]).run()
    assert out.meta["documents_without_summary"] == 1
    assert "- documents_without_summary: 1" in (tmp_path / "report" / "report.md").read_text()
    assert viewer_data(out.result, [Document("d1", source, [["Same."]], None)], {})["documents"][0]["picks"] == \
        {"model": [2]}
    clash = stub([f"tfidf={tmp_path / 'report'}"])
    with pytest.raises(UserError, match="--compare tfidf: the name of a row of this report"):
        clash.run()
    assert not clash.predicted


# ---------------------------------------------------------------- what a new user meets in the report and viewer
def _extract_case():
    """Two documents of 12 sentences, an extractive model's picks (one at sentence 11), oracle labels."""
    src = [f"Sentence number {i} of the story." for i in range(12)]
    labels = np.zeros(12, dtype=int)
    labels[[1, 4]] = 1
    docs = [Document(f"d{j}", src, [["Sentence number 1 of the story."]], labels) for j in range(2)]
    picks = [[0, 1, 10], [0, 2, 3]]
    systems = {"model": [[src[i] for i in p] for p in picks],
               "lead3": [src[:3], src[:3]], "oracle": [[src[1], src[4]]] * 2}
    result = score_systems(docs, systems, n_resamples=10)
    result["picks"] = {"model": picks}
    return docs, result


def test_position_histograms_of_the_picks_lead3_and_the_oracle():
    from hibert.finetune.evaluation.report import position_histograms

    docs, result = _extract_case()
    pos = position_histograms(result, docs)
    assert pos["bins"] == ["1", "2", "3", "4", "5", "6", "7", "8", "9", "10+"]
    model = pos["systems"]["model"]
    assert model["picks"] == 6 and model["counts"] == [2, 1, 1, 1, 0, 0, 0, 0, 0, 1]     # sentence 11 -> 10+
    assert model["share"][0] == round(2 / 6, 4)
    assert pos["systems"]["lead3"]["counts"][:3] == [2, 2, 2]
    assert pos["systems"]["oracle"]["counts"] == [0, 2, 0, 0, 2, 0, 0, 0, 0, 0]
    del result["picks"]
    assert position_histograms(result, docs) == {}      # an abstractive result: no picks, no histogram


def test_report_md_notes_first_readable_meta_selection_and_positions(tmp_path):
    """Notes above everything, the generation settings as a nested list (not a Python dict), no empty
    `compared_with: []`, k and trigram blocking as one selection line pointing at the note that says where they
    come from, the picked-position table for the model and the oracle; report.json keeps them all."""
    from hibert.finetune.evaluation.report import chart_title, write_report

    docs, result = _extract_case()
    note = "k=3, trigram blocking on: the selection the model is served with, tuned on its validation split"
    meta = {"notes": ["the decoder cannot write yet", note], "task": "extractive", "split": "test", "k": 3,
            "trigram_blocking": True, "selection_given": False, "generation": {"beam_size": 4, "early_stopping": True}, "compared_with": [],
            "encoder_init": None}
    paths = write_report(tmp_path / "ext" / "report-test", result, docs, meta)
    md = paths["md"].read_text()
    lines = md.splitlines()
    assert lines[2] == "> **Note:** the decoder cannot write yet" and lines[4] == f"> **Note:** {note}"
    assert md.index(note) < md.index("- documents: 2")
    assert "compared_with" not in md and "{'" not in md and "- notes" not in md
    assert "- generation:\n  - beam_size: 4\n  - early_stopping: on\n" in md
    assert "- selection: k=3 sentences, trigram blocking on (where these come from: see the notes above)" in md
    assert "- k: 3" not in md and "selection_given" not in md and "- encoder_init: none" in md
    assert "| picked sentence position | 1 | 2 | 3 | 4 | 5 | 6 | 7 | 8 | 9 | 10+ |" in md
    assert "| model (6 picks) | 33 | 17 | 17 | 17 | 0 | 0 | 0 | 0 | 0 | 17 |" in md
    assert "| oracle (4 picks) | 0 | 50 | 0 | 0 | 50 | 0 | 0 | 0 | 0 | 0 |" in md
    report = json.loads(paths["json"].read_text())
    assert report["meta"]["notes"] == meta["notes"] and report["positions"]["systems"]["model"]["picks"] == 6
    assert chart_title(tmp_path / "ext" / "report-test", meta, 2) == \
        "ext (extractive): ROUGE on test, 2 documents (95% CI)"
    assert chart_title(tmp_path / "elsewhere", meta, 2).startswith("elsewhere (extractive): ROUGE on test")
    assert paths["png"].stat().st_size > 10_000


def test_viewer_legend_shows_only_the_marks_of_its_page():
    """An extractive page (the report's picks): the model's and the oracle's picks, no copied/novel marks; an
    abstractive page: copied spans and novel words, no model's pick (its summary is not an extract)."""
    docs, result = _extract_case()
    ext = viewer_data(result, docs, {"task": "extractive"})
    assert ext["legend"] == {"copy": False, "pick-model": True, "pick-oracle": True}
    assert ext["positions"] == {}          # write_report passes them in (tested in a browser below)
    abs_result = {"summaries": {"model": [SUMMARY], "lead3": [SOURCE]}}
    page = viewer_data(abs_result, [Document("a", SOURCE, [["ref."]], None)],
                       {"task": "abstractive", "reads_sentences": 1, "generation": {"beam_size": 4},
                        "compared_with": [], "notes": ["n1"]})
    assert page["legend"] == {"copy": True, "pick-model": False, "pick-oracle": False}
    assert page["reads_sentences"] == 1 and page["notes"] == ["n1"]
    assert page["meta"] == {"task": "abstractive", "reads_sentences": "1", "generation": "beam_size 4"}
    read = viewer_data(abs_result, [Document("a", SOURCE, [["ref."]], None)],
                       {"reads": "its first sentence", "reads_sentences": 1})
    assert read["meta"] == {"reads": "its first sentence"} and read["reads_sentences"] == 1


def _pixels_vary(png) -> bool:
    import matplotlib.image

    img = matplotlib.image.imread(str(png))
    return img.shape[0] > 100 and float(img[..., :3].std()) > 0.02


def test_viewer_in_a_browser_notes_hint_sort_arrow_legend_unread_sentences_and_positions(tmp_path):
    """The pages a new user opens, rendered by headless chromium: the notes first, the one-line hint that rows
    open, the sorted column's arrow (#worst: model R1 ascending), a legend of only the page's marks, the
    sentences the model does not read greyed under a note, the picked-position table; a non-blank screenshot."""
    from hibert.finetune.evaluation.report import write_report

    # abstractive: the model reads the first 2 of 4 sentences
    src = SOURCE + ["A third sentence nobody reads.", "And a fourth one."]
    docs = [Document(f"a{i}", src, [["The council approved the budget."]], np.array([1, 0, 0, 0]))
            for i in range(3)]
    systems = {"model": [SUMMARY] * 3, "lead3": [src[:3]] * 3, "oracle": [[src[0]]] * 3}
    result = score_systems(docs, systems, n_resamples=10)
    meta = {"notes": ["this model's decoder cannot write yet"], "task": "abstractive", "split": "test",
            "reads": "the first chunk of each document (its first 2 sentences)", "reads_sentences": 2}
    viewer = write_report(tmp_path / "abs", result, docs, meta)["html"]
    assert "data.max_doc_sentences" not in viewer.read_text()
    shot = tmp_path / "viewer.png"
    dom = render_in_chromium(viewer, "worst&open=0", shot)
    assert shot.stat().st_size > 10_000 and _pixels_vary(shot)
    assert '<div class="notes" id="notes"><p><strong>Note:</strong> this model\'s decoder cannot write yet</p>' in dom
    assert dom.index('id="notes"') < dom.index('id="meta"') < dom.index('id="docs"')
    assert "Click a row to open its document" in dom and dom.index('id="hint"') < dom.index('id="docs"')
    assert 'data-key="model:rouge1_f" title="sort by model R1" class="sorted">model R1 ▲</th>' in dom
    thead = dom.split("<thead>", 1)[1].split("</thead>", 1)[0]
    assert thead.count("▲") + thead.count("▼") == 1
    legend = dom.split('id="legend">', 1)[1].split("</div>", 1)[0]
    assert "copied from the source" in legend and "novel word" in legend and "oracle's pick" in legend
    assert "model's pick" not in legend and "not read by the model" in legend
    assert "the model reads the first 2)" in dom and 'class="unread-note">not read by the model: sentences 3–4' in dom
    assert '<div class="sent unread">A third sentence nobody reads.</div>' in dom
    assert 'class="positions"' not in dom       # no picks: no position table

    docs, result = _extract_case()
    viewer = write_report(tmp_path / "ext", result, docs, {"task": "extractive", "split": "test", "notes": []})["html"]
    dom = render_in_chromium(viewer, "open=0")
    assert 'id="notes"></div>' in dom and "Click a row to open its document" in dom
    legend = dom.split('id="legend">', 1)[1].split("</div>", 1)[0]
    assert "model's pick" in legend and "oracle's pick" in legend and "copied from the source" not in legend
    table = dom.split('<table class="positions">', 1)[1].split("</table>", 1)[0]
    assert "<caption>picked sentence position" in table and "<th>10+</th>" in table
    assert "<th>model (6 picks)</th><td>33</td><td>17</td>" in table
    assert "<th>oracle (4 picks)</th><td>0</td><td>50</td>" in table
    rows = dom.split('id="docs"', 1)[1].split("</table>", 1)[0]
    assert '<div class="sent' in rows and "unread" not in rows     # an extractive model reads every sentence


def test_the_evaluation_puts_the_fluency_note_before_the_heads_own_notes(tmp_path):
    """A head whose exports decode (`HeadSpec.decodes`) and record a perplexity its decoder cannot write at:
    the fluency note first in the meta's notes, then the note the head's report meta gave; both shown at the
    top of report.md and of the viewer. A head that does not decode gets its own notes only."""
    from hibert.finetune.evaluation.skeleton import SummaryEvaluation
    from hibert.heads import registered_heads

    decoding = next(name for name, h in registered_heads().items() if h.decodes)
    export = tmp_path / "export"
    export.mkdir()
    (export / "export.json").write_text(json.dumps({"task": decoding, "metrics": {"valid_ppl": 400.0}}))

    class Stub(SummaryEvaluation):
        def load(self):
            return None, {}

        def view(self):
            return [Document("d1", SOURCE, [["The council approved the budget."]], None)]

        def predict(self, docs):
            return [SUMMARY]

        def report_meta(self, compared_with):
            return {"task": "stub", "split": "test", "notes": "the head's own note", "compared_with": compared_with}

    def run(export_dir, out):
        settings = SimpleNamespace(compare=[], split="test", bootstrap=10, report_dir=lambda run: out)
        return Stub(SimpleNamespace(run_dir=tmp_path), settings, export_dir, "ref").run()

    outcome = run(export, tmp_path / "r1")
    notes = outcome.meta["notes"]
    assert list(outcome.meta)[0] == "notes" and len(notes) == 2 and notes[1] == "the head's own note"
    assert notes[0].startswith("this model's decoder cannot write yet (validation perplexity 400")
    md = (tmp_path / "r1" / "report.md").read_text()
    assert md.index(notes[0]) < md.index(notes[1]) < md.index("- documents:")
    page = (tmp_path / "r1" / "viewer.html").read_text()
    assert page.index("cannot write yet") < page.index('id="meta"')
    plain = tmp_path / "plain"
    plain.mkdir()
    assert run(plain, tmp_path / "r2").meta["notes"] == ["the head's own note"]


def test_loss_chart_labels_its_axes_and_marks_the_kept_checkpoint():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from hibert.slurm.local import loss_figure

    series = [{"task": "t", "name": "run-a", "train_loss": ([10, 20, 30], [3.0, 2.0, 1.5]),
               "valid_loss": ([15, 30], [2.5, 2.7]), "kept": [15], "kept_by": "valid_rouge"},
              {"task": "t", "name": "run-b", "train_loss": ([10, 20], [3.0, 2.5]), "valid_loss": ([], []),
               "kept": []}]
    fig = loss_figure([("t", "some finetuning")], series)
    train, valid = fig.axes
    assert (train.get_ylabel(), valid.get_ylabel()) == ("training loss", "validation loss")
    labels = [t.get_text() for t in train.get_legend().get_texts()]
    assert labels == ["run-a (kept: step 15, best valid_rouge)", "run-b"]
    vlines = [ln for ln in valid.lines if list(ln.get_xdata()) == [15, 15]]
    stars = [ln for ln in valid.lines if ln.get_marker() == "*"]
    assert len(vlines) == 1 and len(stars) == 1 and list(stars[0].get_ydata()) == [2.5]
    plt.close(fig)


def test_the_abstractive_meta_says_how_many_sentences_the_model_reads():
    """The first chunk's size is the dataset's max_doc_sentences: the `reads` line prints the number (not the
    key's name) and `reads_sentences` gives it to the viewer."""
    from hibert.finetune.abstractive.evaluate import AbstractiveEvaluation

    ev = AbstractiveEvaluation.__new__(AbstractiveEvaluation)
    ev.cfg = SimpleNamespace(data=SimpleNamespace(max_doc_sentences=30, dataset_dir="/nonexistent"))
    ev.settings, ev.ref, ev.meta = SimpleNamespace(split="test"), "runs/x/export", {}
    ev.resolved = SimpleNamespace(model_dump=lambda: {"beam_size": 4})
    ev.model = SimpleNamespace(encoder=SimpleNamespace(cfg=SimpleNamespace(max_positions=128)))
    ev.test = SimpleNamespace(manifest={"limits": {"max_doc_sentences": 7}})
    meta = ev.report_meta([])
    assert meta["reads"] == "the first chunk of each document (<= 128 positions; its first 7 sentences)"
    assert meta["reads_sentences"] == 7


def test_report_md_shows_markup_in_documents_and_ids_as_text(tmp_path):
    """Source, summary, reference and id text with <script>, <img onerror>, <iframe>, an unclosed <!-- (which hid
    the rest of the report in any Markdown renderer) and | (a table cell) are text in report.md, not markup."""
    from hibert.finetune.evaluation.report import write_report

    evil = ["<script>alert(1)</script> a | b", "<img src=x onerror=alert(2)> <iframe src=//x>", "<!-- hidden"]
    docs = [Document("id<!--x", evil, [["<b>ref</b> & more"]], np.array([1, 0, 0]))]
    result = score_systems(docs, {"model": [evil[:2]], "lead3": [evil]}, n_resamples=10)
    md = write_report(tmp_path / "r", result, docs, {"task": "extractive", "notes": ["<!-- a note"]})["md"].read_text()
    assert "<" not in md.split("## Examples")[1]
    assert "<script>" not in md and "<img" not in md and "<iframe" not in md and "<!--" not in md and "<b>" not in md
    assert "&lt;script&gt;alert(1)&lt;/script&gt; a \\| b" in md and "### id&lt;!--x" in md
    assert "&lt;b&gt;ref&lt;/b&gt; &amp; more" in md and "**Note:** &lt;!-- a note" in md
