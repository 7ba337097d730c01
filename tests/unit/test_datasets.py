"""The sweep's traffic (``bench.dataset``): bad files and keys refused before any work, the default keeps the config
hash, the command-line flags of each kind, the WikiText prompts file, the lengths sent and a shared-prefix workload's
hit rate in the record, and the review's workload line."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from quantverdict.children import wikitext_prompts
from quantverdict.children.sweep_client import cli_args, sampling_of
from quantverdict.children.workload_check import dataset_args, prompt_length_problem, requests_to_send
from quantverdict.config.compose import compose
from quantverdict.config.schema import ConfigError
from quantverdict.measure.bench_result import add_client_side
from quantverdict.measure.points import SweepPoint
from quantverdict.measure.workload import (
    add_workload,
    expected_prefix_hit_rate,
    length_distribution,
    shared_prefix_tokens,
)
from quantverdict.orchestrate.resume import config_hash, hashed_config
from quantverdict.processes.envs import StageEnv
from quantverdict.results.record import JobRecord, Workload
from quantverdict.review.speed import workload
from quantverdict.serving.workload import TEXT_FILE, prepare
from review_records import record

# --- errors before any work ------------------------------------------------------------------------------------


def _jsonl(tmp_path: Path, text: str) -> str:
    path = tmp_path / "prompts.jsonl"
    path.write_text(text, encoding="utf-8")
    return str(path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "is empty (0 bytes)"),
        ("\n  \n", "is empty (only whitespace)"),
        ('{"prompt": "a"}\nnot json\n', "line 2 is not JSON"),
        ('["a"]\n', "line 1 is a JSON list, not an object"),
        ('{"text": "a"}\n', 'line 1 has no "prompt" string'),
        ('{"prompt": 7}\n', 'line 1 has a int as "prompt" string'),
        ('{"prompt": "a", "output_tokens": "12"}\n', 'line 1 has "output_tokens": "12", not an integer'),
        ('{"prompt": "a", "output_tokens": 0}\n', 'line 1 has "output_tokens": 0, not a positive integer'),
        ('{"prompt": "a", "output_tokens": 4}\n{"prompt": "b"}\n', '"output_tokens" is on 1 of 2 prompt lines (line 2'),
        # model.max_model_len of the default model (smollm2-135m) is 2048: 2048 output tokens leave no prompt room
        ('{"prompt": "a", "output_tokens": 2048}\n', 'line 1 asks for "output_tokens": 2048, which leaves no room'),
    ],
)
def test_a_bad_prompts_file_is_refused_naming_the_key_and_line(tmp_path: Path, text: str, message: str) -> None:
    path = _jsonl(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        compose(["bench.dataset.kind=jsonl", f"bench.dataset.path={path}"])
    assert f"bench.dataset.path={path!r}" in str(err.value)
    assert message in str(err.value)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["bench.dataset.kind=jsonl"], "bench.dataset.kind=jsonl needs bench.dataset.path"),
        (["bench.dataset.kind=jsonl", "bench.dataset.path=/nonexistent/p.jsonl"], "does not exist"),
        # bench.input_len is 256 in the default profile: a prefix of 256 leaves no token of a request's own
        (["bench.dataset.kind=shared_prefix", "bench.dataset.prefix_len=256"], "bench.dataset.prefix_len=256 must be"),
        (["bench.dataset.kind=shared_prefix", "bench.dataset.num_prefixes=0"], "bench.dataset.num_prefixes=0 must be"),
        (["bench.dataset.kind=text", "bench.dataset.min_words=50", "bench.dataset.max_words=10"], "min_words <="),
        (["bench.dataset.kind=random", "bench.dataset.path=/x.jsonl"], "bench.dataset.path is read only with"),
        (["bench.dataset.kind=shared_prefix", "bench.input_len=2000", "bench.output_len=100"], "exceeds the server"),
    ],
)
def test_bad_dataset_keys_are_refused(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        compose(overrides)
    assert message in str(err.value)


def test_text_without_its_offline_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        compose(["bench.dataset.kind=text", f"data.offline_root={tmp_path}"])
    assert "bench.dataset.kind=text reads wikitext-2-raw/wiki.test.raw under data.offline_root" in str(err.value)


def test_a_good_prompts_file_composes_and_a_random_config_keeps_its_hash(tmp_path: Path) -> None:
    path = _jsonl(tmp_path, '{"prompt": "a", "output_tokens": 4}\n\n{"prompt": "b", "output_tokens": 9}\n')
    jsonl = compose(["bench.dataset.kind=jsonl", f"bench.dataset.path={path}"])
    plain = compose([])
    assert "dataset" not in hashed_config(plain)["bench"]  # the default traffic hashes as before the group existed
    assert config_hash(compose(["bench.dataset.prefix_len=64"])) == config_hash(plain)  # unread by random
    assert config_hash(jsonl) != config_hash(plain)


# --- the command line of each kind -------------------------------------------------------------------------------


def test_each_kind_has_the_flags_of_its_vllm_dataset() -> None:
    assert dataset_args(None, 256, 32) == [
        "--dataset-name",
        "random",
        "--random-input-len",
        "256",
        "--random-output-len",
        "32",
    ]
    shared = {"kind": "shared_prefix", "prefix_len": 160, "num_prefixes": 2}
    assert dataset_args(shared, 224, 16) == [
        "--dataset-name",
        "prefix_repetition",
        "--prefix-repetition-prefix-len",
        "160",
        "--prefix-repetition-suffix-len",
        "64",  # 224 - 160
        "--prefix-repetition-num-prefixes",
        "2",
        "--prefix-repetition-output-len",
        "16",
    ]
    own = {"kind": "jsonl", "path": "/p.jsonl", "output_tokens_from_file": True}
    assert dataset_args(own, 256, 32)[-2:] == ["--custom-output-len", "-1"]  # each line's output_tokens
    text = {"kind": "text", "path": "/w.jsonl", "output_tokens_from_file": False}
    assert dataset_args(text, 256, 32) == [
        "--dataset-name",
        "custom",
        "--dataset-path",
        "/w.jsonl",
        "--skip-chat-template",
        "--custom-output-len",
        "32",
    ]


def test_a_shared_prefix_run_sends_whole_groups_and_records_its_output_length() -> None:
    shared = {"kind": "shared_prefix", "prefix_len": 128, "num_prefixes": 4}
    assert requests_to_send(shared, 10) == 12  # ceil(10 / 4) = 3 groups of 4
    assert requests_to_send(shared, 8) == 8
    assert requests_to_send({"kind": "jsonl"}, 10) == 10
    spec = {
        "base_url": "http://h:1",
        "model": "m",
        "tokenizer": "/t",
        "input_len": 256,
        "output_len": 32,
        "percentile_metrics": "ttft",
        "metric_percentiles": "50",
        "dataset": shared,
    }
    argv = cli_args(spec, {"name": "p", "request_rate": "inf"}, 10, 3, save=False)
    assert argv[argv.index("--num-prompts") + 1] == "12"
    assert sampling_of(argv)["max_tokens"] == 32
    spec["dataset"] = {"kind": "jsonl", "path": "/p.jsonl", "output_tokens_from_file": True}
    assert sampling_of(cli_args(spec, {"name": "p", "request_rate": "inf"}, 10, 3, save=False))["max_tokens"] is None


# --- the prompts' tokens against the context ----------------------------------------------------------------------


def test_the_longest_request_over_the_context_is_named() -> None:
    prompts = [(1, "a", None), (3, "b", None), (4, "c", 10)]
    # line 3: 900 + 128 = 1,028 > 1,024; line 4: 1,000 + 10 = 1,010 fits; line 1: 100 + 128 = 228 fits
    problem = prompt_length_problem(prompts, [100, 900, 1000], 128, 1024, "p.jsonl")
    assert problem is not None
    assert "1 of 3 prompts of p.jsonl do not fit the server's max_model_len 1024" in problem
    assert "line 3: 900 prompt tokens + 128 output tokens = 1028" in problem
    assert prompt_length_problem(prompts, [100, 896, 1000], 128, 1024, "p.jsonl") is None  # 896 + 128 = 1,024


# --- the built-in text ----------------------------------------------------------------------------------------------

TINY_WIKI = [
    " = Title = ",
    " ",
    " one two three four ",
    " = = Section = = ",
    " five six ",
    " seven eight nine ten eleven twelve ",
    "",
]


def test_wikitext_paragraphs_keep_their_order_within_the_word_bounds(tmp_path: Path) -> None:
    # headings and blank lines dropped; 4, 2 and 6 words: bounds 2..4 keep the first two
    assert wikitext_prompts.paragraphs(TINY_WIKI, 2, 4) == ["one two three four", "five six"]
    assert wikitext_prompts.paragraphs(TINY_WIKI, 5, 6) == ["seven eight nine ten eleven twelve"]
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    assert wikitext_prompts.build(TINY_WIKI, 2, 6, a) == 3
    wikitext_prompts.build(TINY_WIKI, 2, 6, b)
    assert a.read_bytes() == b.read_bytes()  # a function of the text and the bounds
    assert [json.loads(line) for line in a.read_text().splitlines()][1] == {"prompt": "five six"}
    with pytest.raises(ValueError, match="min_words=7..max_words=9"):
        wikitext_prompts.build(TINY_WIKI, 7, 9, tmp_path / "c.jsonl")


# --- the record --------------------------------------------------------------------------------------------------


def test_length_percentiles_by_hand() -> None:
    # 1..100, linear between closest ranks: p1 at rank 0.99 -> 1.99, p50 at 49.5 -> 50.5, p90 at 89.1 -> 90.1,
    # p99 at 98.01 -> 99.01
    assert length_distribution(list(range(1, 101))) == {
        "min": 1.0,
        "p1": 1.99,
        "p50": 50.5,
        "p90": 90.1,
        "p99": 99.01,
        "max": 100.0,
        "mean": 50.5,
    }
    # 10, 20, 30, 40: p90 at rank 2.7 -> 30 + 0.7 x 10 = 37; p1 at rank 0.03 -> 10.3
    dist = length_distribution([40, 10, 30, 20])
    assert dist is not None and (dist["p1"], dist["p50"], dist["p90"], dist["mean"]) == (10.3, 25.0, 37.0, 25.0)
    assert length_distribution([]) is None


def test_a_shared_prefix_points_hits_are_the_workloads_not_reuse() -> None:
    shared = {"kind": "shared_prefix", "prefix_len": 160, "num_prefixes": 1}
    assert shared_prefix_tokens(shared, 4) == 480  # 3 x 160
    assert shared_prefix_tokens({"kind": "random"}, 4) is None
    assert expected_prefix_hit_rate(4, 1, 160, 224) == pytest.approx(480 / 896)
    # 4 prompts of 224 tokens, 3 of them served their first 128-token block: 384 hits of 896 looked up (42.9%)
    side = {
        "counters_before": {"vllm:prefix_cache_queries": 0.0, "vllm:prefix_cache_hits": 0.0},
        "counters_after": {"vllm:prefix_cache_queries": 896.0, "vllm:prefix_cache_hits": 384.0},
    }
    reused = add_client_side(SweepPoint(point="p", input_tokens_total=896), side)
    assert reused.valid is False  # on random prompts 42.9% > 1% is reuse
    point = add_client_side(SweepPoint(point="p", input_tokens_total=896), side, shared_tokens=480)
    assert point.valid is not False and point.prefix_cache_excess_hit_rate == 0.0  # max(0, 384 - 480) / 896
    add_workload(point, [224, 224, 224, 224], [16, 16, 16, 16], shared, 224)
    assert point.workload_prefix_hit_rate == pytest.approx(384 / 896)
    assert point.workload_prefix_hit_rate_expected == pytest.approx(480 / 896)
    assert point.input_len_dist is not None and point.input_len_dist.p50 == 224.0
    assert point.output_len_dist is not None and point.output_len_dist.max == 16.0
    again = SweepPoint.model_validate(point.to_dict())  # the record's JSON keeps them
    assert again.workload_prefix_hit_rate_expected == pytest.approx(0.5357, abs=1e-4)


def test_the_review_names_a_prompts_file_and_the_lengths_it_sent() -> None:
    rec = JobRecord.model_validate(record("bf16"))
    plain = workload(rec).text
    rec.speed.workload = Workload(kind="random", input_len=256, output_len=32)
    assert workload(rec).text == plain  # the random prompts keep their line
    rec.speed.workload = Workload(kind="jsonl", source="/d/chat.jsonl", sha256="ab" * 32, prompts=40, output_len=32)
    for p in rec.speed.points:
        add_workload(p, [10, 20, 30, 40], [32, 32, 32, 32], None, 256)
    text = workload(rec).text
    # medians over the points of p50 25, p1 10.3 and p99 39.7 (rounded to whole tokens)
    assert text.startswith("prompts of chat.jsonl (40 lines, sha256 abababababab): p50 25 (p1 10, p99 40) in / ")
    assert "p50 32 (p1 32, p99 32) out tokens per request" in text


def test_prepare_writes_the_text_prompts_and_records_a_files_digest(tmp_path: Path) -> None:
    env = StageEnv("serve", "/nonexistent/python", {})  # neither kind below starts a child
    cfg = compose(["bench.dataset.kind=text", "bench.dataset.min_words=4", "bench.dataset.max_words=400"])
    assert cfg.data.offline_root  # the synthetic offline data of the unit tier
    w = prepare(cfg, tmp_path / "bench", env)
    written = (tmp_path / "bench" / TEXT_FILE).read_text().splitlines()
    assert w.kind == "text" and w.prompts == len(written) > 0 and w.file == str((tmp_path / "bench" / TEXT_FILE))
    assert all(4 <= len(json.loads(line)["prompt"].split()) <= 400 for line in written)
    path = _jsonl(tmp_path, '{"prompt": "a"}\n')  # 16 bytes: {"prompt": "a"} and a newline
    own = compose(["bench.dataset.kind=jsonl", f"bench.dataset.path={path}"])
    w = prepare(own, tmp_path / "b2", env)
    assert (w.prompts, w.output_tokens_from_file, w.output_len) == (1, False, own.bench.output_len)
    assert w.sha256 == hashlib.sha256(b'{"prompt": "a"}\n').hexdigest()


@pytest.mark.parametrize(
    ("overrides", "said"),
    [
        ([], "256 in / 32 out tokens"),
        (["bench.dataset.kind=text", "bench.dataset.max_words=64"], "WikiText-2 paragraphs of 16-64 words in / 32 out"),
        (
            ["bench.dataset.kind=shared_prefix", "bench.dataset.prefix_len=160", "bench.dataset.num_prefixes=2"],
            "256 in (a 160-token prefix shared by each of 2 groups) / 32 out tokens",
        ),
    ],
    ids=["random", "text", "shared_prefix"],
)
def test_the_sweep_says_what_each_request_sends(overrides: list[str], said: str) -> None:
    from quantverdict.config.workload import request_shape

    # the cpu profile: 256 in / 32 out (conf/bench/cpu.yaml); a text workload sends paragraphs, not bench.input_len
    bench = compose(["bench=cpu", *overrides]).bench
    assert request_shape(bench).startswith(said)
