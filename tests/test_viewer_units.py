"""The output viewer and the report's document grouping on hand-checked cases: tokens that split punctuation
off and match NFKC forms while the original text is shown, picks among repeated sentences, the page's sorting
and filtering in a real browser, and documents without a reference summary."""
import html
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
