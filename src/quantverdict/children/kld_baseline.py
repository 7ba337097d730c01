"""KL divergence to the baseline inside the evaluate child: the baseline job stores its next-token
distributions, a scheme job reads them back and compares its own.

Same text, tokenization and windows as the token perplexity (:mod:`quantverdict.children.token_perplexity`);
the math is :mod:`quantverdict.measure.kld`. Imports the standard library, numpy and scipy (the serve environment
has both, scipy through lm-eval's scikit-learn) and project modules that need no more.

What is stored (one cache entry per baseline, the folder the orchestrator names in ``spec["kld"]["dir"]``,
:func:`quantverdict.orchestrate.caches.kld_spec`): the baseline's top-k form (:class:`quantverdict.measure.kld.TopK`)
per scored token -- the ``k`` most likely token ids (int32) and their log-probabilities (float32), the
log-probability of the token that follows (float64) and, hf backend only, the exact log of the remaining
mass (float64; NaN on the server backend, where vLLM does not return it) -- in ``topk.npz``, and
``meta.json`` (the key, the text key, k, the windows, the baseline's config hash and job).

Why top-k and not the full vocabulary: the embedded SmolLM2-135M on the CPU profile scores 4,094 tokens
(2 windows of 2,047) over a 49,152-token vocabulary: the full log-probabilities are 4,094 x 49,152 x 2 bytes
= 402 MB in float16 per baseline (and 201 M float64 values to hold while comparing), against
4,094 x (k x 8 + 16) bytes = 0.7 MB at k = 20 (``eval.kld.top_k``); the GPU profile's whole WikiText-2 test text
(~290k tokens) would be 28 GB in float16. The server backend can only have the top-k anyway (vLLM's
``prompt_logprobs``, at most ``--max-logprobs``, default 20). The price is that the recorded KLD is a lower
bound of the true one: ``KL(P‖Q) >= KL_S``, the KL of the distributions with every token outside the known
ids lumped into one bucket (log-sum inequality; :func:`quantverdict.measure.kld.topk_token_stats`), with the
gap ``P_rest · KL(P_R/P_rest ‖ Q_R/Q_rest)`` -- zero when the scheme spreads the tail like the baseline, at
most ``P_rest`` times the largest tail log-ratio. On the hf backend the scheme's full vocabulary is at hand,
so its side is exact (:func:`quantverdict.measure.kld.scheme_at_ids`) and a per-token upper bound is also
computed (:func:`quantverdict.measure.kld.topk_kld_bounds`, recorded as ``mean_kld_upper``); top-1 agreement
and Δp are exact on both backends.

A scheme job compares only against an entry whose key (model source, backend, device, dtype, windows, k:
the baseline-relevant config) and text key (the token ids and the window plan) are its own; otherwise its
result is ``{"refused": reason}`` and nothing is compared.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from quantverdict.measure.kld import (
    TokenStats,
    TopK,
    concat_token_stats,
    scheme_at_ids,
    summarize,
    topk_from_full,
    topk_kld_bounds,
    topk_token_stats,
)

__all__ = ["KldRun", "KldRefused", "load_baseline", "open_run", "save_baseline", "text_key"]

FORMAT_VERSION = 1
DATA_FILE = "topk.npz"
META_FILE = "meta.json"
ROW_CHUNK = 256  # rows of [n, vocab] float64 at a time (256 x 152k x 8 B = 311 MB per copy)
# meta keys a scheme's run must share with the stored baseline to compare against it
MATCH_KEYS = ("format", "key", "text_key", "top_k", "form")


class KldRefused(Exception):
    """The baseline's stored distributions cannot be compared with this run (absent, or other settings)."""


def text_key(ids: Sequence[int], plan: Sequence[tuple[int, int, int]]) -> str:
    """sha256 (first 16 hex) of the scored token ids and the window plan: the same text, tokenization,
    ``max_tokens`` and windows give the same key."""
    h = hashlib.sha256()
    h.update(json.dumps([list(w) for w in plan]).encode())
    h.update(np.asarray(ids, dtype=np.int64).tobytes())
    return h.hexdigest()[:16]


def _rows(tk: TopK, sl: slice) -> TopK:
    rest = None if tk.rest_logprob is None else np.asarray(tk.rest_logprob)[sl]
    return TopK(
        ids=np.asarray(tk.ids)[sl],
        logprobs=np.asarray(tk.logprobs)[sl],
        target_logprob=np.asarray(tk.target_logprob)[sl],
        rest_logprob=rest,
    )


def save_baseline(entry: Path, windows: list[TopK], meta: dict[str, Any]) -> None:
    """Write one baseline's windows (``topk.npz``) and ``meta.json`` into ``entry``, replacing what was there.

    Written to a sibling temporary folder first and renamed into place (under an ``flock`` on a sibling lock file,
    so two writers take turns), so a reader never sees half an entry.
    """
    ids = np.concatenate([np.asarray(w.ids, dtype=np.int32) for w in windows])
    lps = np.concatenate([np.asarray(w.logprobs, dtype=np.float32) for w in windows])
    tgt = np.concatenate([np.asarray(w.target_logprob, dtype=np.float64) for w in windows])
    rest = np.concatenate(
        [
            np.full(len(w.target_logprob), np.nan) if w.rest_logprob is None else np.asarray(w.rest_logprob, np.float64)
            for w in windows
        ]
    )
    n_rows = np.array([len(w.target_logprob) for w in windows], dtype=np.int64)
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = entry.with_name(f".{entry.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    np.savez(tmp / DATA_FILE, ids=ids, logprobs=lps, target_logprob=tgt, rest_logprob=rest, n_rows=n_rows)
    (tmp / META_FILE).write_text(json.dumps(meta, indent=2, default=str))
    # two baseline jobs of one model at once (parallel grids) take turns at the swap; the lock file stays (empty)
    with open(entry.with_name(f".{entry.name}.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if entry.exists():
            shutil.rmtree(entry)
        tmp.rename(entry)


def load_baseline(entry: Path, expect: dict[str, Any]) -> tuple[dict[str, Any], list[TopK]]:
    """The stored baseline windows of ``entry``, if its meta matches ``expect`` on :data:`MATCH_KEYS`.

    Raises:
        KldRefused: no entry, or one stored with other settings (the message names the keys that differ).
    """
    meta_path = entry / META_FILE
    if not meta_path.is_file():
        found = entry.parent.glob("[!.]*") if entry.parent.is_dir() else []  # not the .tmp folders, .lock files
        others = sorted(p.name for p in found if (p / META_FILE).is_file())
        hint = ""
        if others:
            differ = _key_field_diffs(expect.get("key_fields") or {}, entry.parent / others[-1] / META_FILE)
            hint = f"; this model has baseline entries with other settings ({', '.join(others)}): {differ}"
        raise KldRefused(
            f"no stored baseline distributions at {entry}: run the baseline scheme's job first with the same eval "
            f"settings (and resume=false if its identical job finished before the cache was made){hint}"
        )
    meta = json.loads(meta_path.read_text())
    diffs = [
        f"{k}: stored {meta.get(k)!r} vs this job {expect.get(k)!r}" for k in MATCH_KEYS if meta.get(k) != expect.get(k)
    ]
    if diffs:
        raise KldRefused(
            f"the stored baseline distributions at {entry} were made with other settings ({'; '.join(diffs)}): "
            "rerun the baseline job with this job's eval settings and text"
        )
    with np.load(entry / DATA_FILE) as z:
        ids, lps, tgt, rest, n_rows = (z[k] for k in ("ids", "logprobs", "target_logprob", "rest_logprob", "n_rows"))
    out, start = [], 0
    for n in n_rows.tolist():
        sl = slice(start, start + n)
        r = rest[sl]
        out.append(
            TopK(ids=ids[sl], logprobs=lps[sl], target_logprob=tgt[sl], rest_logprob=None if np.isnan(r).any() else r)
        )
        start += n
    return meta, out


def _key_field_diffs(want: dict[str, Any], other_meta: Path) -> str:
    try:
        have = json.loads(other_meta.read_text()).get("key_fields") or {}
    except (OSError, ValueError):
        return "unreadable"
    diffs = [
        f"{k}: {have.get(k)!r} vs {want.get(k)!r}" for k in sorted(set(want) | set(have)) if have.get(k) != want.get(k)
    ]
    return "; ".join(diffs) or "same key fields"


@dataclass
class KldRun:
    """One evaluate child's KLD work over the token-perplexity windows.

    ``role`` is ``"baseline"`` (store this model's distributions) or ``"scheme"`` (compare with the stored
    ones, ``base``). Window results are kept by window index (thread-safe: each index is written once) and
    joined in window order by :meth:`finish`.
    """

    role: str
    top_k: int
    entry: Path
    meta: dict[str, Any]
    base: list[TopK] | None = None
    baseline_meta: dict[str, Any] | None = None
    refused: str | None = None
    stored: dict[int, TopK] = field(default_factory=dict)
    stats: dict[int, TokenStats] = field(default_factory=dict)
    upper_sum: dict[int, float] = field(default_factory=dict)
    compare_s: dict[int, float] = field(default_factory=dict)

    @property
    def active(self) -> bool:
        """False when refused: the windows are scored for perplexity only."""
        return self.refused is None

    def hf_window(self, index: int, logprobs: np.ndarray, targets: np.ndarray) -> None:
        """hf backend: one window's full log-probabilities ``[n_scored, vocab]`` (nats) and target ids."""
        if not self.active:
            return
        t0 = time.perf_counter()
        n = logprobs.shape[0]
        chunks = [slice(i, min(i + ROW_CHUNK, n)) for i in range(0, n, ROW_CHUNK)]
        if self.role == "baseline":
            parts = [topk_from_full(logprobs[sl], self.top_k, targets[sl]) for sl in chunks]
            self.stored[index] = TopK(
                ids=np.concatenate([p.ids for p in parts]),
                logprobs=np.concatenate([p.logprobs for p in parts]),
                target_logprob=np.concatenate([p.target_logprob for p in parts]),
                rest_logprob=np.concatenate([np.asarray(p.rest_logprob) for p in parts]),
            )
        else:
            base = self._base_window(index, n)
            stats, upper = [], 0.0
            for sl in chunks:
                b = _rows(base, sl)
                s = scheme_at_ids(logprobs[sl], b.ids, targets[sl])
                stats.append(topk_token_stats(b, s))
                upper += float(np.sum(topk_kld_bounds(b, s, np.min(logprobs[sl], axis=1))[1]))
            self.stats[index] = concat_token_stats(stats)
            self.upper_sum[index] = upper
        self.compare_s[index] = time.perf_counter() - t0

    def topk_window(
        self, index: int, tops: Sequence[Sequence[tuple[int, float]]], target_logprobs: Sequence[float]
    ) -> None:
        """Server backend: one window's top-k ``(id, log-prob)`` pairs per scored token and the targets' log-probs."""
        if not self.active:
            return
        t0 = time.perf_counter()
        k = self.top_k
        if any(len(row) != k for row in tops):
            raise RuntimeError(f"a scored position has other than top_k={k} entries")
        own = TopK(
            ids=np.array([[i for i, _ in row] for row in tops], dtype=np.int64).reshape(len(tops), k),
            logprobs=np.array([[v for _, v in row] for row in tops], dtype=np.float64).reshape(len(tops), k),
            target_logprob=np.asarray(target_logprobs, dtype=np.float64),
        )
        if self.role == "baseline":
            self.stored[index] = own
        else:
            self.stats[index] = topk_token_stats(self._base_window(index, len(tops)), own)
        self.compare_s[index] = time.perf_counter() - t0

    def _base_window(self, index: int, n: int) -> TopK:
        assert self.base is not None
        if index >= len(self.base) or len(self.base[index].target_logprob) != n:
            raise RuntimeError(f"window {index}: the stored baseline has other windows than this run")
        return self.base[index]

    def finish(self, n_windows: int, confidence: float = 0.95) -> dict[str, Any]:
        """The record's ``accuracy.kld``: the baseline's stored entry, or the scheme's summary
        (:class:`quantverdict.measure.kld.KldSummary` fields plus where the baseline came from)."""
        if self.refused is not None:
            return {"refused": self.refused, "role": self.role}
        common = {"role": self.role, "top_k": self.top_k, "entry": str(self.entry), "text_key": self.meta["text_key"]}
        compare_s = round(sum(self.compare_s.values()), 3)
        if self.role == "baseline":
            windows = [self.stored[i] for i in range(n_windows)]
            save_baseline(self.entry, windows, self.meta)
            return {**common, "stored_tokens": int(sum(len(w.target_logprob) for w in windows)), "compare_s": compare_s}
        per_window = [self.stats[i] for i in range(n_windows)]
        summary = summarize(per_window, confidence=confidence).to_dict()
        bm = self.baseline_meta or {}
        out: dict[str, Any] = {
            **summary,
            **common,
            "baseline_config_hash": bm.get("config_hash"),
            "baseline_job_id": bm.get("job_id"),
            "compare_s": compare_s,
        }
        if self.upper_sum:  # hf backend: the top-k bound's other side
            out["mean_kld_upper"] = sum(self.upper_sum[i] for i in range(n_windows)) / summary["n_tokens"]  # type: ignore[operator]
        return out


def open_run(spec: dict[str, Any] | None, ids: Sequence[int], plan: Sequence[tuple[int, int, int]]) -> KldRun | None:
    """The KLD work of this child from ``spec["kld"]`` (None: no KLD), checked before any window is scored.

    ``spec`` keys (:func:`quantverdict.orchestrate.caches.kld_spec`): ``role``, ``top_k``, ``dir`` (the
    cache entry), ``key``, ``key_fields``, ``config_hash``, ``job_id``. A scheme's run whose baseline entry is
    absent or was made with other settings is returned refused (:attr:`KldRun.refused`).
    """
    if not spec:
        return None
    meta = {
        "format": FORMAT_VERSION,
        "form": "topk",
        "key": spec["key"],
        "key_fields": spec.get("key_fields"),
        "text_key": text_key(ids, plan),
        "top_k": int(spec["top_k"]),
        "windows": [list(w) for w in plan],
        "config_hash": spec.get("config_hash"),
        "job_id": spec.get("job_id"),
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    run = KldRun(role=spec["role"], top_k=int(spec["top_k"]), entry=Path(spec["dir"]), meta=meta)
    if run.role == "scheme":
        try:
            run.baseline_meta, run.base = load_baseline(run.entry, meta)
        except KldRefused as exc:
            run.refused = str(exc)
    elif run.role != "baseline":
        raise ValueError(f"kld role {run.role!r} must be 'baseline' or 'scheme'")
    return run
