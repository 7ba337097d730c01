"""The study pages of docs/results (index.md and one page and plot per study) are what
``tools/results/make_results.py`` writes from the committed records today: text identical, plots identical in
bytes (Agg, no time or version in the PNG metadata)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.results import make_results

pytestmark = [pytest.mark.results, pytest.mark.slow]

PAGES = [
    "index",
    "regime-crossover",
    "kld-accuracy",
    "crossmodel-a10g",
    "hopper-schemes",
    "starts-energy",
    "saturation",
    "capacity-slo",
    "cpu-grid",
]


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("pages")
    make_results.build(out)
    return out


def test_every_page_and_plot_is_written(written: Path) -> None:
    names = sorted(p.name for p in written.iterdir())
    assert names == sorted([f"{p}.md" for p in PAGES] + [f"{p}.png" for p in PAGES if p != "index"])


def test_committed_pages_equal_the_generated_ones(written: Path) -> None:
    assert make_results.compare(written) == []


def test_regime_page_answers_the_prefill_question_first(written: Path) -> None:
    lines = (written / "regime-crossover.md").read_text().splitlines()
    assert lines[2].startswith("**Does W4A16 pay at high concurrency for prefill-heavy traffic on an H200?** ")
    # the prefill-heavy W4A16 grid at concurrency 256: 2 paired repeats, ratios 0.9537 and 0.9521 of bf16's
    # output tok/s (the records' output_tok_s); geometric mean 0.9529, t(0.975, 1) = 12.706 on the log ratios
    assert "0.95x bf16's output tok/s (95% CI 0.94-0.96, 2 paired repeats; slower)" in lines[2]
    assert lines[2].split("** ")[1].startswith("No:")
    table_row = next(line for line in lines if line.startswith("| prefill-heavy | 2,048 / 128 | W4A16 |"))
    assert table_row.endswith("| 0.95x [0.94, 0.96] n=2 |")


def test_starts_page_pairs_the_speedups_by_server_start(written: Path) -> None:
    lines = (written / "starts-energy.md").read_text().splitlines()
    assert lines[0] == "# Server starts and energy per output token: llama3.1-8b-shape on three H100 machines"
    question = (
        "**Do the speedups over bf16 replicate from machine to machine and across server starts, and what does each "
    )
    assert lines[2].startswith(question)
    # 3 schemes x 3 loads less bf16: 6 cells a machine; W4A16 at c=256 is faster on no machine, FP8_DYNAMIC at
    # c=256 on machines 1 and 3, the 4 cells at c=1 and 64 on all three
    assert (
        lines[2]
        .split("?** ")[1]
        .startswith(
            "Partly, paired by server start on each machine (each scheme's server started 2 times on machine 1, 3 "
            "times on machine 2 and 3 times on machine 3): "
        )
    )
    # machine 1, W4A16 at c=256, the records' output tok/s per start over bf16's of the same start: 9,063.6 /
    # 10,072.3 = 0.89986 and 9,186.8 / 9,427.6 = 0.97446; logs -0.10552 and -0.02587, mean -0.06570 -> 0.936x; their
    # sd 0.05632, se 0.05632 / sqrt 2 = 0.03982, t(0.975, 1) = 12.706 -> +-0.50601 -> [0.5646, 1.5532]: includes 1.
    # Between its starts: 9,186.8 / 9,063.6 - 1 = 1.36%
    row = next(line for line in lines if line.startswith("| gptq (W4A16) | 256 | 9,064 |"))
    assert row == "| gptq (W4A16) | 256 | 9,064 | 9,187 | 1.4% | 0.94x [0.56, 1.55] n=2 | no difference established |"
    # machine 2, W4A16 at c=256: 7,564.70 / 9,213.56 = 0.82104, 9,318.64 / 9,229.21 = 1.00969 and 9,709.16 /
    # 9,858.61 = 0.98484; logs -0.19718, +0.00964, -0.01528, mean -0.06761 -> 0.9346x; sd 0.11291, se 0.11291 /
    # sqrt 3 = 0.06519, t(0.975, 2) = 4.3027 -> +-0.28048 -> [0.7060, 1.2372]: includes 1, as machine 1's; the
    # intervals overlap (0.71 <= 1.55 and 0.56 <= 1.24).
    # machine 3, W4A16 at c=256: 9,943.57 / 10,162.21 = 0.97848, 10,070.12 / 10,146.74 = 0.99245 and 10,102.56 /
    # 10,178.83 = 0.99251; logs -0.02175, -0.00758, -0.00752, mean -0.01228 -> 0.9878x; sd 0.008199, se 0.008199 /
    # sqrt 3 = 0.004733, t(0.975, 2) = 4.3027 -> +-0.020367 -> [0.9679, 1.0081]: includes 1, inside both others
    row = next(line for line in lines if line.startswith("| gptq (W4A16) | 256 | 0.94x"))
    assert row == (
        "| gptq (W4A16) | 256 | 0.94x [0.56, 1.55] n=2 | 0.90x, 0.97x | 0.93x [0.71, 1.24] n=3 | 0.82x, 1.01x, 0.98x "
        "| 0.99x [0.97, 1.01] n=3 | 0.98x, 0.99x, 0.99x | yes | yes, all 3 include 1 |"
    )
    assert (
        "on no machine at c=256 (machine 1 0.94x [0.56, 1.55], machine 2 0.93x [0.71, 1.24], machine 3 0.99x "
        "[0.97, 1.01])" in lines[2]
    )
    # machine 3, W4A16 at c=64: 6,666.54 / 5,981.38 = 1.11455, 6,679.16 / 5,994.61 = 1.11419, 6,705.84 / 5,962.60 =
    # 1.12465; mean log 0.111351 -> 1.1178x, se 0.0030622 x 4.3027 -> [1.1032, 1.1326]: wholly above 1.05x
    row = next(line for line in lines if line.startswith("| gptq (W4A16) | 64 | 6,667 |"))
    assert row == "| gptq (W4A16) | 64 | 6,667 | 6,679 | 6,706 | 0.6% | 1.12x [1.10, 1.13] n=3 | faster |"
    # start by start: of the 8 per-start ratios above, only 1.00969 is above 1
    assert (
        "W4A16 at c=256 is above bf16 in 1 of 8 starts (machine 1 0.90x, 0.97x; machine 2 0.82x, 1.01x, 0.98x; "
        "machine 3 0.98x, 0.99x, 0.99x)" in (lines[2])
    )
    # machine 1, bf16 at c=1, the records' gpu.energy_per_output_token_j of starts 1 and 2: 2.90219 and 2.93011 J,
    # median (2.90219 + 2.93011) / 2 = 2.91615; output_tok_per_j 0.344567 and 0.341284, median 0.342925
    row = next(line for line in lines if line.startswith("| bf16 (BF16) | 1 | 2.92"))
    assert row.startswith("| bf16 (BF16) | 1 | 2.92 (2.90-2.93) | 0.343 | ")
    # machine 2, W4A16 at c=256, the records by start: output_tok_s 7,564.7 / 9,318.6 / 9,709.2, gpu.idle_fraction
    # 0.20231 (idle_longest_s 1.2) / 0.02128 / 0.00741; per busy second 7,564.7 / (1 - 0.20231) = 9,483,
    # 9,318.6 / 0.97872 = 9,521, 9,709.2 / 0.99259 = 9,782; spreads 9,709.2 / 7,564.7 - 1 = 28.3% of output tok/s
    # against 9,782 / 9,483 - 1 = 3.1% per busy second
    assert "| 2 | W4A16 | 7,565, 20.2 (1.2), 9,483 | 9,319, 2.1 (0.2), 9,521 | 9,709, 0.7 (0.1), 9,782 |" in lines
    idle = next(line for line in lines if line.startswith("Between-start spread at c=256"))
    assert "W4A16 on machine 2 28.3% -> 3.1%" in idle


def test_one_way_sd_splits_within_and_between_groups() -> None:
    # groups [1, 2, 3] and [4, 5, 6]: means 2 and 5, grand mean 3.5; MSB = 3 x ((2 - 3.5)^2 + (5 - 3.5)^2) / 1 = 13.5;
    # MSW = (1 + 0 + 1 + 1 + 0 + 1) / (2 x 2) = 1; within sqrt(1) = 1, between sqrt((13.5 - 1) / 3) = 2.0412
    within, between = make_results.one_way_sd([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    assert within == pytest.approx(1.0) and between == pytest.approx(2.0412, abs=1e-4)
    # the groups' means apart by less than the noise predicts: no between-group part
    assert make_results.one_way_sd([[1.0, 3.0], [1.5, 2.5]])[1] == 0.0
    with pytest.raises(ValueError, match="sizes"):
        make_results.one_way_sd([[1.0, 2.0], [3.0]])


def test_saturation_page_reads_the_idle_share_and_the_api_server(written: Path) -> None:
    lines = (written / "saturation.md").read_text().splitlines()
    assert lines[0] == "# What stalls the GPU at saturation (W4A16, c=256, one H100)"
    # the idlest window: start 4's third repeat (repeat 2, counted from 0 as the review does): the record's
    # output_tok_s 7,337.4 with the GPU idle in 44 of its 179 NVML samples (0.2458): 7,337.4 / (1 - 0.2458) = 9,728.9
    # tok/s per busy second; in its idle samples the API server at a median 100% of one core, the engine core at 0%,
    # the client at 70%
    row = next(line for line in lines if line.startswith("| starts | 4 | 2 |"))
    assert row.endswith("| 7,337 | 24.6 | 1.2 | 9,729 | 100 | 0 | 70 |")
    assert lines[2].split("?** ")[1].startswith("The API server, not the GPU.")
    # the same load on machine 3 of the starts page: its gptq record's three c=256 points, output_tok_s 9,943.6 /
    # 10,070.1 / 10,102.6 (median 10,070), gpu.idle_fraction 0 / 0.0077 / 0.0077 and the API server's median over
    # each whole window 70% of a core; this page's 12 windows: median 100%, idle 7.4-24.6%, 7,337-8,883 tok/s
    # (8,883 / 7,337 - 1 = 21%)
    assert "| starts page, machine 3 (GPU-918035c3) | 3 | 10,070 (9,944-10,103) | 0.8 (0.0-0.8) | 70 (70) |" in lines
    assert "| this page, `starts` (GPU-7a73909d) | 12 | 8,147 (7,337-8,883) | 15.1 (7.4-24.6) | 100 (100) |" in lines
    assert any("the GPU idled and the windows spread 21%" in line for line in lines)


def test_capacity_page_reads_each_capacity_off_the_recorded_levels(written: Path) -> None:
    lines = (written / "capacity-slo.md").read_text().splitlines()
    random_answer, text_answer = lines[2].split(" On WikiText-2 paragraphs")
    # random prompts, bf16's search: 136 requests in flight passed (816 of 816 requests met TTFT <= 1,000 ms and TPOT
    # <= 25 ms), 144 failed (849 / 864 = 98.26% < 99%); fp8: 176 passed (1,056 / 1,056), 192 failed (1,122 / 1,152 =
    # 97.40%); gptq: 128 passed (768 / 768), 136 failed (805 / 816 = 98.65%)
    assert "fp8 (FP8_DYNAMIC) carries the most: 176 requests in flight [176, 192)" in random_answer
    assert "bf16 (BF16) 136 [136, 144) and gptq (W4A16) 128 [128, 136)" in random_answer
    # WikiText-2 paragraphs: bf16 224 passed (1,344 / 1,344), 240 failed (1,165 / 1,200 = 97.08%); fp8 320 passed
    # (1,595 / 1,600 = 99.69% >= 99%), 352 failed (1,373 / 1,408 = 97.51%); gptq 224 passed, 240 failed (1,156 / 1,200)
    assert "fp8 (FP8_DYNAMIC) carries the most: 320 requests in flight [320, 352)" in text_answer
    assert "bf16 (BF16) 224 [224, 240) and gptq (W4A16) 224 [224, 240)" in text_answer
    heads = [i for i, line in enumerate(lines) if line.startswith("| scheme | capacity (requests in flight) |")]
    assert len(heads) == 2  # one table a workload
    rand, text = ({line.split(" | ")[0]: line for line in lines[h + 2 : h + 5]} for h in heads)
    # capacity over bf16: 176 / 136 = 1.294; range 176 / 144 = 1.222 to 192 / 136 = 1.412; gptq 128 / 136 = 0.941,
    # 128 / 144 = 0.889 to 136 / 136 = 1.000. USD / Mtok at $3.00 per GPU-hour: 3.0 / (8,093.16 tok/s x 3,600 s)
    # x 10^6 = 0.1030 for bf16's output tok/s at 136 in flight
    assert rand["| bf16 (BF16)"] == "| bf16 (BF16) | 136 | [136, 144) | 1x (the reference) | 8,093 | 0.103 |"
    assert "| 176 | [176, 192) | 1.29x (1.22-1.41) |" in rand["| fp8 (FP8_DYNAMIC)"]
    assert "| 128 | [128, 136) | 0.94x (0.89-1.00) |" in rand["| gptq (W4A16)"]
    # WikiText-2: fp8 320 / 224 = 1.429, range 320 / 240 = 1.333 to 352 / 224 = 1.571; gptq 224 / 224 = 1.00, range
    # 224 / 240 = 0.933 to 240 / 224 = 1.071. bf16: 3.0 / (11,723.6 tok/s x 3,600 s) x 10^6 = 0.0711
    assert text["| bf16 (BF16)"] == "| bf16 (BF16) | 224 | [224, 240) | 1x (the reference) | 11,724 | 0.071 |"
    assert "| 320 | [320, 352) | 1.43x (1.33-1.57) |" in text["| fp8 (FP8_DYNAMIC)"]
    assert "| 224 | [224, 240) | 1.00x (0.93-1.07) |" in text["| gptq (W4A16)"]
    # Clopper-Pearson 95% of 849 / 864: the beta quantiles B(0.025; 849, 16) = 0.9715 and B(0.975; 850, 15) = 0.9903
    assert "| bf16 (BF16) | 144 | 849 / 864 | 98.26% [97.15, 99.03] | fail |" in lines
    assert "| fp8 (FP8_DYNAMIC) | 320 | 1,595 / 1,600 | 99.69% [99.27, 99.90] | pass |" in lines
    # the text workload's lengths as sent (the review's workload line): 1,759 paragraphs, input tokens p50 134
    assert "Sent: WikiText-2 test paragraphs of 16-256 words (1,759 prompts): p50 134 (p1 24, p99 316) in" in "\n".join(
        lines
    )
