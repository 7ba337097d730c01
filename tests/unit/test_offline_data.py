"""Offline source conversion on small hand-made inputs and the synthetic offline folder of tests/fixtures (the real
files: tests/integration/test_offline_files.py)."""

from __future__ import annotations

import bz2
import json
import re
from pathlib import Path

import pytest

from conftest import SYNTHETIC_DATA
from quantverdict.children import offline_data as od

# -- WikiText -------------------------------------------------------------------------------------

RAW_NO_BLANKS = [
    " = A = ",
    " Alpha text . ",
    " = = Sub = = ",
    " More . ",
    " = B = ",
    " Beta . ",
]


def test_restore_wikitext_lines_layout() -> None:
    # file start: one blank before the first title; a title: two blanks before (one after);
    # a sub-heading: one blank before and after; two blanks and the final "" at the end.
    assert od.restore_wikitext_lines(RAW_NO_BLANKS) == [
        " ", " = A = ", " ", " Alpha text . ",
        " ", " = = Sub = = ", " ", " More . ",
        " ", " ", " = B = ", " ", " Beta . ",
        " ", " ", "",
    ]  # fmt: skip
    # input that already has blank lines comes out the same
    assert od.restore_wikitext_lines(od.restore_wikitext_lines(RAW_NO_BLANKS)) == od.restore_wikitext_lines(
        RAW_NO_BLANKS
    )


def test_wikitext_pages_split_at_titles_only() -> None:
    pages = od.wikitext_pages(od.restore_wikitext_lines(RAW_NO_BLANKS))
    # the leading " " line is dropped (the hub script keeps what precedes a title only if it is not
    # blank); the two blanks before " = B = " end page A.
    assert pages == [
        " = A = \n \n Alpha text . \n \n = = Sub = = \n \n More . \n \n ",
        " = B = \n \n Beta . \n \n \n",
    ]
    # lm-eval counts words on the original page: re.split(r"\s+") of page B gives
    # ['', '=', 'B', '=', 'Beta', '.', ''] -> 7 "words"; bytes: " = B = " 7 + "\n \n" 3 + " Beta . " 8
    # + "\n \n \n" 5 = 23
    assert len(re.split(r"\s+", pages[1])) == 7
    assert len(pages[1].encode()) == 23


def test_wikitext_hf_rows() -> None:
    # blank lines become "", others keep a trailing newline; the final "" (after the last newline) is dropped
    assert od.wikitext_hf_rows([" ", " = A = ", " ", " x . ", ""]) == ["", " = A = \n", "", " x . \n"]


def test_read_wikitext_lines_crlf(tmp_path: Path) -> None:
    p = tmp_path / "w.raw"
    p.write_bytes(b" = A = \r\n Alpha . \r\n")
    assert od.read_wikitext_lines(p) == [" ", " = A = ", " ", " Alpha . ", " ", " ", ""]


# -- multiple choice ------------------------------------------------------------------------------


def test_arc_docs_drops_para_and_keeps_numeric_labels(tmp_path: Path) -> None:
    p = tmp_path / "arc.jsonl"
    item = {
        "id": "X_1",
        "question": {
            "stem": "Which?",
            "choices": [{"text": "a", "label": "1", "para": "long"}, {"text": "b", "label": "2", "para": "long"}],
        },
        "answerKey": "2",
    }
    p.write_text(json.dumps(item) + "\n")
    (doc,) = list(od.arc_docs(p))
    assert doc == {
        "id": "X_1",
        "question": "Which?",
        "choices": {"text": ["a", "b"], "label": ["1", "2"]},
        "answerKey": "2",
    }
    # lm-eval's target expression choices.label.index(answerKey) -> 1
    assert doc["choices"]["label"].index(doc["answerKey"]) == 1
    item["answerKey"] = "E"
    p.write_text(json.dumps(item) + "\n")
    with pytest.raises(ValueError, match="answerKey"):
        list(od.arc_docs(p))


def test_piqa_docs_join_labels(tmp_path: Path) -> None:
    (tmp_path / "v.jsonl").write_text(
        '{"goal": "g1", "sol1": "a", "sol2": "b"}\n{"goal": "g2", "sol1": "c", "sol2": "d"}\n'
    )
    (tmp_path / "l.lst").write_text("1\n0\n")
    docs = list(od.piqa_docs(tmp_path / "v.jsonl", tmp_path / "l.lst"))
    assert [d["label"] for d in docs] == [1, 0] and docs[1]["goal"] == "g2"
    (tmp_path / "l.lst").write_text("1\n")
    with pytest.raises(ValueError, match="labels"):
        list(od.piqa_docs(tmp_path / "v.jsonl", tmp_path / "l.lst"))


@pytest.mark.parametrize(
    "line,expected",
    [
        # ActivityNet: ctx_a "A man is sitting on a roof.", ctx_b "he" -> lm-eval capitalizes ctx_b
        (
            "Roof shingle removal: A man is sitting on a roof. he",
            "Roof shingle removal: A man is sitting on a roof. He",
        ),
        # str.capitalize() also lower-cases the rest of ctx_b, as lm-eval's does
        ("X: A lady walks. the lady and Tom", "X: A lady walks. The lady and tom"),
        # WikiHow: ctx_b empty, the context ends in a full sentence -> unchanged
        ("Home: Find a space. Unroll your mat.", "Home: Find a space. Unroll your mat."),
        # no sentence end before the fragment -> unchanged
        ("Y: a fragment only", "Y: a fragment only"),
    ],
)
def test_hellaswag_query(line: str, expected: str) -> None:
    assert od.hellaswag_query(line) == expected


def test_hellaswag_docs(tmp_path: Path) -> None:
    p = tmp_path / "h.txt.bz2"
    p.write_bytes(bz2.compress(b"Act: A man sits. he\n2\ne0\ne1\ne2\ne3\n"))
    assert list(od.hellaswag_docs(p)) == [
        {"query": "Act: A man sits. He", "choices": ["e0", "e1", "e2", "e3"], "label": 2}
    ]
    p.write_bytes(bz2.compress(b"Act: x\n2\ne0\ne1\n"))
    with pytest.raises(ValueError, match="multiple of 6"):
        list(od.hellaswag_docs(p))


def test_boolq_string_labels(tmp_path: Path) -> None:
    p = tmp_path / "b.jsonl"
    p.write_text(
        '{"question": "q", "passage": "p", "idx": 0, "label": "true"}\n'
        '{"question": "r", "passage": "s", "idx": 1, "label": "false"}\n'
    )
    assert [d["label"] for d in od.boolq_docs(p)] == [1, 0]


# -- prepare: the synthetic folder --------------------------------------------------------------


def test_prepare_unknown_task(tmp_path: Path) -> None:
    with pytest.raises(KeyError, match="known"):
        od.prepare(["mmlu"], tmp_path, tmp_path)


def test_prepare_synthetic_files(tmp_path: Path) -> None:
    tasks = ["wikitext", "arc_easy", "arc_challenge", "piqa", "hellaswag", "boolq"]
    out = od.prepare(tasks, SYNTHETIC_DATA, tmp_path)
    # two made-up items a file (tests/fixtures/offline_data/SOURCES.md); wiki.test.raw: two " = Title = " articles
    assert {t: out.info[t]["n_docs"] for t in tasks} == dict.fromkeys(tasks, 2)
    for t in tasks:
        yaml = (out.include_path / f"{t}.yaml").read_text()
        assert f"task: {t}\n" in yaml and str(out.data_files[t]) in yaml and "${" not in yaml
        assert Path(out.data_files[t]).is_absolute()
    assert (out.include_path / "utils.py").is_file()
    # the same inputs reuse the same directory
    assert od.prepare(tasks, SYNTHETIC_DATA, tmp_path).include_path == out.include_path
    # the first article with its blank lines restored; the sub-heading stays inside it
    first = json.loads(out.data_files["wikitext"].read_text().splitlines()[0])["page"]
    assert first == (
        " = Copper kettle = \n \n Copper kettles heat water on a stove . \n \n = = Use = = \n \n"
        " A kettle boils water for tea . \n \n "
    )
    # HellaSwag: ctx_b capitalized ("she" -> "She"), gold label 1
    hs = json.loads(out.data_files["hellaswag"].read_text().splitlines()[0])
    assert hs["query"] == "Baking: A woman mixes flour and water in a bowl. She" and hs["label"] == 1


def test_wikitext_valid_layout_reconstruction_synthetic() -> None:
    # the tokenized file keeps its blank lines: removing them and restoring them gives back both articles
    lines = (SYNTHETIC_DATA / "wikitext-2" / "valid.txt").read_text(encoding="utf-8").split("\n")
    original = od.wikitext_pages(lines)
    assert len(original) == 2
    assert od.wikitext_pages(od.restore_wikitext_lines([line for line in lines if line.strip()])) == original
