"""Count the repeated prompts of sweep points measured before the client counted them, from the same sample.

Runs in the serve environment (vLLM's benchmark library)::

    python -m quantverdict.children.recount_repeats <job>/bench [--tokenizer DIR]

For each ``<point>.qv.json`` in the folder without ``prompt_repeats``, vLLM's ``get_samples`` is called with
the arguments the point's measured run had (``sweep_client.spec.json``, the point's final seed and request
count: :func:`quantverdict.children.sweep_client.vllm_args`), and the prompts it returns are counted
(:func:`quantverdict.measure.prompt_repeats.prompt_repeats`). vLLM's random dataset is deterministic in its
seed, so this is the prompt set the server saw, as long as the tokenizer and vLLM's ``RandomDataset`` are
the same (``--tokenizer``: a copy of the checkpoint's tokenizer where the recorded path does not exist
here). Checked where the point's result file is present: the request count must equal the run's
``num_prompts`` and, when every request completed, the prompt tokens its ``total_input_tokens`` (a weak
check: a tokenizer with another vocabulary but the same special tokens passes it; the server's prefix-cache hits
per repeated prompt are the cross-check). The
sidecar gains ``prompt_repeats`` and ``prompt_repeats_source`` (vLLM version, tokenizer); rerun
the record's derivation (``python -m tools.bench.bench_gpu --report-only``) to apply it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from quantverdict.children.sweep_client import vllm_args
from quantverdict.children.vllm_cli import bench_parser, install_alias
from quantverdict.measure.prompt_repeats import prompt_repeats


def recount(bench_dir: Path, tokenizer: str | None = None) -> list[dict[str, Any]]:
    """Add ``prompt_repeats`` to each sidecar in ``bench_dir`` that lacks it; returns one row per point
    (``point``, ``requests``, ``repeated_requests``, ``repeated_tokens``, ``prompt_tokens``, ``recounted``)."""
    install_alias()
    import vllm
    from vllm.benchmarks import serve as vbench
    from vllm.tokenizers import get_tokenizer

    spec = json.loads((bench_dir / "sweep_client.spec.json").read_text())
    if tokenizer:
        spec["tokenizer"] = tokenizer
    parser, missing = bench_parser(vbench)
    tok = get_tokenizer(spec["tokenizer"])
    rows = []
    for point in spec["points"]:
        side_path = bench_dir / f"{point['name']}.qv.json"
        if not side_path.is_file():
            continue
        side = json.loads(side_path.read_text())
        recounted = "prompt_repeats" not in side
        if recounted:
            args = vllm_args(spec, point, int(side["num_prompts"]), int(side["seed"]), False, missing)
            reqs = vbench.get_samples(parser.parse_args(args), tok)
            counted = prompt_repeats((r.prompt, r.prompt_len) for r in reqs)
            result_path = bench_dir / f"{point['name']}.json"
            if result_path.is_file():  # the same prompts as the run's: as many, as many tokens
                res = json.loads(result_path.read_text())
                sent = (res.get("num_prompts"), res.get("total_input_tokens"))
                got = (counted["requests"], counted["prompt_tokens"])
                if got[0] != sent[0] or (res.get("completed") == sent[0] and got[1] != sent[1]):
                    raise RuntimeError(
                        f"{point['name']}: the recount sampled {counted['requests']} prompts of "
                        f"{counted['prompt_tokens']} tokens, the run sent {sent[0]} of {sent[1]}: not the run's "
                        "prompts (e.g. a tokenizer with other special tokens); give the checkpoint's tokenizer "
                        "with --tokenizer"
                    )
            side["prompt_repeats"] = counted
            side["prompt_repeats_source"] = (
                f"recounted after the run: vLLM {vllm.__version__} get_samples, seed {side['seed']}, "
                f"{side['num_prompts']} requests, tokenizer {spec['tokenizer']}"
            )
            side_path.write_text(json.dumps(side, indent=1))
        rows.append({"point": point["name"], **side["prompt_repeats"], "recounted": recounted})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m quantverdict.children.recount_repeats", description=__doc__)
    ap.add_argument("bench_dir", type=Path, help="a job's bench/ folder (sweep_client.spec.json, <point>.qv.json)")
    ap.add_argument("--tokenizer", default=None, help="the checkpoint's tokenizer here (default: the recorded path)")
    args = ap.parse_args(argv)
    for row in recount(args.bench_dir, args.tokenizer):
        print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
