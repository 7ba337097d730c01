"""What the GPU did in a measured window: nvidia-smi's text parsed (the fallback where pynvml is missing), and a
window's energy per token, idle share and throttle and drift flags from samples. Values worked out by hand in the
comments. The NVML path itself runs in tests/integration/test_gpu_sampler.py (skipped without a GPU)."""

from __future__ import annotations

from typing import Any

import pytest

from quantverdict.children.sweep_client import cli_args, sampling_of
from quantverdict.measure import gpu_samples

# `nvidia-smi --query-gpu=<QUERY_FIELDS> --format=csv,noheader,nounits -lms=100` on an H200 (driver 580), idle then
# under a bf16 GEMM loop: power W, SM and memory clocks MHz, temperature C, utilization %, clocks-event reasons
QUERY_TEXT = """\
2026/12/04 10:15:02.113, 0, 76.12, 345, 3201, 31, 0, 0x0000000000000001
2026/12/04 10:15:02.213, 0, 77.40, 1980, 3201, 31, 0, 0x0000000000000000
2026/12/04 10:15:02.313, 0, 690.55, 1755, 3201, 44, 100, 0x0000000000000004
2026/12/04 10:15:02.413, 0, [N/A], 1755, 3201, 45, 100, [N/A]
"""

# `nvidia-smi dmon -s puc` (power and temperatures, utilization, clocks): names line, units line, one line a second
DMON_TEXT = """\
# gpu    pwr  gtemp  mtemp     sm    mem    enc    dec    jpg    ofa   mclk   pclk
# Idx      W      C      C      %      %      %      %      %      %    MHz    MHz
    0     76     31     40      0      0      0      0      0      0   3201    345
    0    688     44     52    100     38      0      0      0      0   3201   1755
# gpu    pwr  gtemp  mtemp     sm    mem    enc    dec    jpg    ofa   mclk   pclk
# Idx      W      C      C      %      %      %      %      %      %    MHz    MHz
    0    702     46      -     97     35      0      0      0      0   3201   1740
"""

# the same with `-o DT`: date and time first
DMON_DT_TEXT = """\
#Date       Time        gpu    pwr  gtemp  mtemp     sm    mem    enc    dec    jpg    ofa   mclk   pclk
#YYYYMMDD   HH:MM:SS    Idx      W      C      C      %      %      %      %      %      %    MHz    MHz
 20261204   10:15:02      0     76     31     40      0      0      0      0      0      0   3201    345
 20261204   10:15:03      0    688     44     52    100     38      0      0      0      0   3201   1755
"""


def test_query_csv_lines_become_samples() -> None:
    s = gpu_samples.parse_query_csv(QUERY_TEXT)
    assert len(s) == 4
    assert s[0]["gpu"] == 0 and s[0]["power_w"] == 76.12 and s[0]["sm_clock_mhz"] == 345.0
    assert s[0]["mem_clock_mhz"] == 3201.0 and s[0]["temperature_c"] == 31.0 and s[0]["util_pct"] == 0.0
    assert s[0]["throttle_reasons"] == 0x1 and s[2]["throttle_reasons"] == 0x4
    assert s[3]["power_w"] is None and s[3]["throttle_reasons"] is None  # [N/A]
    # the timestamps are 100 ms apart (10:15:02.113 -> .213 -> .313)
    assert s[1]["t"] - s[0]["t"] == pytest.approx(0.1, abs=1e-6)
    assert s[2]["t"] - s[0]["t"] == pytest.approx(0.2, abs=1e-6)


def test_query_csv_skips_a_header_and_cut_lines() -> None:
    header = ", ".join(gpu_samples.QUERY_FIELDS) + "\n"
    assert len(gpu_samples.parse_query_csv(header + QUERY_TEXT + "2026/12/04 10:15:02.513, 0, 69")) == 4


def test_query_command_asks_for_the_parsed_fields() -> None:
    cmd = gpu_samples.query_command(100, ["0"])
    assert cmd[0] == "nvidia-smi" and "--format=csv,noheader,nounits" in cmd and "-lms=100" in cmd and "--id=0" in cmd
    assert cmd[1] == "--query-gpu=" + ",".join(gpu_samples.QUERY_FIELDS)


def test_dmon_lines_become_samples_and_repeated_headers_are_skipped() -> None:
    s = gpu_samples.parse_dmon(DMON_TEXT)
    assert [x["power_w"] for x in s] == [76.0, 688.0, 702.0]
    assert [x["sm_clock_mhz"] for x in s] == [345.0, 1755.0, 1740.0]  # pclk
    assert [x["util_pct"] for x in s] == [0.0, 100.0, 97.0]  # sm %
    assert s[1]["mem_clock_mhz"] == 3201.0 and s[1]["temperature_c"] == 44.0
    assert s[2]["mtemp"] is None  # "-": not available
    assert "t" not in s[0]  # no -o T: no time column


def test_dmon_with_date_and_time() -> None:
    s = gpu_samples.parse_dmon(DMON_DT_TEXT)
    assert len(s) == 2 and s[1]["t"] - s[0]["t"] == 1.0 and s[1]["power_w"] == 688.0


def test_throttle_reason_names() -> None:
    assert gpu_samples.reason_names(0x4) == ["sw_power_cap"]
    assert gpu_samples.reason_names(0x1 | 0x20) == ["gpu_idle", "sw_thermal_slowdown"]
    assert gpu_samples.reason_names(0x1000) == ["0x1000"]


# --- a window's summary ------------------------------------------------------------------------------------------


def _window_samples(with_energy: bool = True) -> list[dict[str, Any]]:
    """One GPU, every 100 ms from t = 1000.0 to 1001.0 (11 samples): 500 W throughout; the energy counter grows
    50,000 mJ (50 J) per 100 ms; no kernel ran at 1000.4, 1000.5, 1000.6; the SM clock is 1980 MHz before 1000.4 and
    1755 MHz after; the power cap (0x4) is active at the last 4 busy samples."""
    out = []
    for k in range(11):
        util = 0 if k in (4, 5, 6) else 100
        out.append(
            {
                "t": 1000.0 + k / 10,
                "gpu": 0,
                "power_w": 500.0,
                "energy_mj": 1_000_000 + 50_000 * k if with_energy else None,
                "sm_clock_mhz": 1980.0 if k < 4 else 1755.0,
                "mem_clock_mhz": 3201.0,
                "temperature_c": 40.0 + k,
                "util_pct": util,
                "throttle_reasons": 0x4 if k >= 7 else 0x0,
            }
        )
    return out


def test_window_energy_per_token_idle_share_and_flags_by_hand() -> None:
    w = gpu_samples.window_summary(_window_samples(), 1000.0, 1001.0, output_tokens=1000)
    assert w.samples == 11 and w.interval_ms == pytest.approx(100.0)
    # energy counter: 1,500,000 - 1,000,000 mJ = 500 J over the window; 1,000 tokens: 0.5 J/token, 2 tokens/J
    assert (w.energy_j, w.energy_source) == (pytest.approx(500.0), "energy_counter")
    assert w.energy_per_output_token_j == pytest.approx(0.5) and w.output_tok_per_j == pytest.approx(2.0)
    # 3 of 11 samples idle; the longest idle run is 3 samples x 100 ms
    assert w.idle_fraction == pytest.approx(3 / 11) and w.idle_longest_s == pytest.approx(0.3)
    # SM clock: mean (4 x 1980 + 7 x 1755) / 11 = 1836.818; min 1755; busy median (8 busy: 4 x 1980, 4 x 1755) 1867.5
    assert w.sm_clock_mhz_mean == pytest.approx(1836.818, abs=1e-3) and w.sm_clock_mhz_min == 1755.0
    assert w.sm_clock_busy_mhz_median == pytest.approx(1867.5)
    # power cap on 4 of 8 busy samples: limited share 0.5 >= 0.1: throttled
    assert w.limited_fraction == pytest.approx(0.5) and w.throttled is True
    assert w.throttle_reasons == ["sw_power_cap"]
    # first third (t < 1000.333: busy k = 0..3) 1980 MHz, last third (t >= 1000.667: k = 7..10) 1755: 1755/1980 - 1
    assert w.sm_clock_drift_rel == pytest.approx(1755 / 1980 - 1) and w.drifting is True
    assert w.temperature_c_max == 50.0 and w.power_w_mean == 500.0 and w.util_pct_mean == pytest.approx(800 / 11)


def test_window_energy_scaled_from_the_samples_inside_it() -> None:
    # window 1000.05-1000.95: samples at 1000.1 .. 1000.9 (9), the counter grows 400 J over their 0.8 s; the window
    # is 0.9 s: 400 x 0.9 / 0.8 = 450 J
    w = gpu_samples.window_summary(_window_samples(), 1000.05, 1000.95, output_tokens=900)
    assert w.samples == 9 and w.energy_j == pytest.approx(450.0)
    assert w.energy_per_output_token_j == pytest.approx(0.5)


def test_window_energy_from_power_without_a_counter() -> None:
    # 500 W for 1.0 s by the trapezoid rule: 500 J
    w = gpu_samples.window_summary(_window_samples(with_energy=False), 1000.0, 1001.0, output_tokens=250)
    assert (w.energy_j, w.energy_source) == (pytest.approx(500.0), "power_integral")
    assert w.energy_per_output_token_j == pytest.approx(2.0)


def test_a_window_without_samples_says_so() -> None:
    w = gpu_samples.window_summary(_window_samples(), 2000.0, 2001.0, output_tokens=10)
    assert w.samples == 0 and "no GPU sample" in (w.not_measured or "")


def test_every_point_records_the_sampling_it_sent() -> None:
    spec = {
        "base_url": "http://127.0.0.1:8765",
        "model": "m",
        "tokenizer": "/t",
        "input_len": 256,
        "output_len": 32,
        "ignore_eos": True,
        "percentile_metrics": "ttft",
        "metric_percentiles": "50",
        "result_dir": "/r",
    }
    point = {"name": "conc-1_r0", "request_rate": "inf", "max_concurrency": 1}
    argv = cli_args(spec, point, 8, 17, save=True)
    assert sampling_of(argv) == {
        "temperature": 0.0,
        "top_p": None,
        "top_k": None,
        "seed": 17,
        "ignore_eos": True,
        "max_tokens": 32,
    }
    without = [a for a in argv if a not in ("--temperature", "0", "--ignore-eos")]  # an older vLLM: flag dropped
    assert sampling_of(without)["temperature"] is None and sampling_of(without)["ignore_eos"] is False
