"""Functions the offline task YAMLs name with ``!function utils.<name>``.

They are lm-eval's own, imported rather than copied, so that the offline ``wikitext`` task scores and
counts exactly like the built-in one (detokenization; words and bytes counted on the original page).
This file is copied next to the rendered YAMLs by ``quantverdict.children.offline_data.prepare``.
"""

from lm_eval.tasks.wikitext.preprocess_wikitext import process_results as wikitext_process_results
from lm_eval.tasks.wikitext.preprocess_wikitext import wikitext_detokenizer

__all__ = ["wikitext_detokenizer", "wikitext_process_results"]
