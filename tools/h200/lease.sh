#!/usr/bin/env bash
# Runs ON the H200 machine the device tool lends, in the repository copy a `run` call sent (its root). One lease,
# driven call by call (tools/h200/make-parts.sh prints the calls); the verbs run in the order given:
#
#   bash tools/h200/lease.sh stash                   # one call per part, carry=['.devcache/NN']: part -> /tmp/stash
#   bash tools/h200/lease.sh install \
#       queue "prefill-gptq 1500 grid model=llama3.1-8b-shape scheme=bf16,gptq bench=gpu-concurrency-prefill" \
#       queue "fid 420 fidelity llama3.1-8b-shape_bf16 --repeat 0 --concurrency 64 --concurrency 256" \
#       go wait 420
#   bash tools/h200/lease.sh wait 560                # the next calls, back to back, until 'queue done'
#
# stash    copy the carried .devcache/NN/* into /tmp/stash; the first call of a lease notes its start (lease.t0)
# install  check the reassembled bundle against bundle.sha256, unpack it, create the orchestrator venv (.venv) and the
#          stage venvs (env=gpu, under /tmp/qvenvs) offline from its wheelhouse, seeing the image's CUDA torch
#          (as `make setup WHEELHOUSE=... SYSTEM_SITE=1 ARGS="env=gpu env.wheelhouse=... env.system_site_packages=true"`),
#          and the offline data at /tmp/qvdata; once per machine
# queue    "NAME EST_S KIND ARGS...": a step for the runner. KIND grid: `.venv/bin/python -m pipelines.run -m env=gpu
#          env.wheelhouse=/tmp/b/wheelhouse env.system_site_packages=true data.offline_root=/tmp/qvdata
#          paths.output_root=/tmp/qvgpu/NAME ARGS...`; KIND fidelity: `python -m tools.bench.fidelity <record of job
#          ARGS[0], the newest under /tmp/qvgpu> --out /tmp/qvgpu/NAME ARGS[1:]`.
#          EST_S: the seconds the step needs; a step is skipped (and logged) when the lease has less left
# go       start the runner (setsid: it outlives this call) unless it runs; it takes the steps in order
# wait S   follow the runner's log for at most S seconds, until the queue is done or the lease's end (below) is
#          reached, then `collect`; keep S + the call's other work under the 600 s a call may run
# wheel-key DIR  (here, for make-parts.sh) the key install gives the packages of the wheels in DIR
# collect  $OUT/<NAME>.tar.gz per step folder (records, sidecars, result files, server logs; no checkpoints, which
#          live in the cache root; in pieces .00, .01 when over 15 MiB: join them with cat) and $OUT/lease.log, within
#          what $OUT brings back (8 files, 64 MiB; a step past that is left out, and named); a lease that ends
#          mid-step loses no finished job. Also
#          $OUT/jit-cache.tar.gz (cut into .00, .01 pieces of 15 MiB when larger): <cache root>/vllm, vLLM's
#          torch.compile cache and FlashInfer's and Triton's JIT builds. Joined here into .devcache/jit-cache.tar.gz,
#          make-parts.sh puts it in the next bundle and install restores it, so that the next machine's first server
#          skips FlashInfer's sampler build (nvcc, 76-123 s without the cache, 2 s with it on the twelfth lease). It
#          carries serve.key (the installed serve packages) and image.key (torch and its CUDA, the GPU) and is restored
#          only beside the same ones; it is left out
#          when it does not fit what $OUT brings back (torch.compile's artifacts are dropped first)
#
# The lease ends when the session's device time is spent, counted from the asking for the machine (before the
# first command's t0): steps are judged against QV_LEASE_END (epoch seconds; once given to a call it is kept in
# qvlease/lease.end for the later calls and the runner), by default t0 + 1800 - QV_LEASE_MARGIN_S (180). Best: the
# first stash call's return time + the budget_left_s it reported - 60 (collect and the transfer back), e.g.
# `QV_LEASE_END=$(( $(date -d 00:37:38 +%s) + 1727 - 60 ))` before the install call's command. Tests set QV_LEASE_ROOT
# (default /tmp), QV_LEASE_PYTHON (default the checkout's .venv/bin/python), QV_LEASE_SITE_SERVE (default the serve venv's
# site-packages, where vLLM is installed), QV_LEASE_SETUP (a command run instead of the venvs' creation) and QV_CACHE_ROOT (the project's cache root, as in conf/config.yaml; default ~/.cache/quantverdict).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
T="${QV_LEASE_ROOT:-/tmp}"
PY="${QV_LEASE_PYTHON:-$REPO/.venv/bin/python}"
STASH="$T/stash" L="$T/qvlease" RES="$T/qvgpu" DATA="$T/qvdata" WH="$T/b/wheelhouse"
export QV_ENV_ROOT="${QV_ENV_ROOT:-$T/qvenvs}"  # the stage venvs (conf/config.yaml env.root)
SITE_SERVE="${QV_LEASE_SITE_SERVE:-$( (ls -d "$QV_ENV_ROOT"/serve-*/lib/python3*/site-packages 2>/dev/null || true) | head -1)}"
SITE_SERVE="${SITE_SERVE:-$QV_ENV_ROOT/serve-not-installed}"
GPU_ENV="env=gpu env.wheelhouse=$WH env.system_site_packages=true"
JIT="${QV_CACHE_ROOT:-$HOME/.cache/quantverdict}/vllm"  # the serve stage's VLLM_CACHE_ROOT (serving/server.py)
PIECE=$(( 15 * 1024 * 1024 ))  # a file back from $OUT: at most 16 MiB
OUT_FILES=8 OUT_BYTES=$(( 62 * 1024 * 1024 ))  # what comes back from $OUT: 8 files, 64 MiB together (2 MiB kept)
mkdir -p "$L" "$RES"
if [ -n "${QV_LEASE_END:-}" ]; then
  [[ "$QV_LEASE_END" =~ ^[0-9]+$ ]] || { echo "lease.sh: QV_LEASE_END '$QV_LEASE_END' is not epoch seconds" >&2; exit 2; }
  echo "$QV_LEASE_END" > "$L/lease.end"
fi
say() { printf '[lease %s] %s\n' "$(date -u +%H:%M:%S)" "$*" | tee -a "$L/lease.log"; }

lease_end() {
  # the newest end given to any call (each call writes its QV_LEASE_END there): the runner, started by an earlier
  # call with that call's environment, follows a corrected end too
  if [ -f "$L/lease.end" ]; then cat "$L/lease.end"; return; fi
  local t0; t0=$(cat "$L/lease.t0" 2>/dev/null || date +%s)
  echo $(( t0 + 1800 - ${QV_LEASE_MARGIN_S:-180} ))
}

stash() {
  [ -f "$L/lease.t0" ] || date +%s > "$L/lease.t0"
  mkdir -p "$STASH"
  local n=0
  for d in "$REPO"/.devcache/[0-9][0-9]; do
    [ -d "$d" ] || continue
    cp "$d"/* "$STASH"/ && n=$(( n + 1 ))
  done
  [ "$n" -gt 0 ] || { say "stash: no .devcache/NN carried"; exit 2; }
  say "stash: $(find "$STASH" -name 'part.*' | wc -l) parts in $STASH ($(du -sh "$STASH" | cut -f1))"
}

install() {
  if [ -f "$L/installed" ] && [ -d "$DATA" ]; then say "install: already installed"; return; fi
  [ -f "$STASH/bundle.sha256" ] || { say "install: no $STASH/bundle.sha256 (part 00 not stashed)"; exit 2; }
  cat "$STASH"/part.* > "$T/bundle.tar"
  if ! (cd "$T" && sha256sum -c --quiet "$STASH/bundle.sha256"); then
    say "install: the reassembled bundle does not match bundle.sha256 (a part missing: $(ls "$STASH" | tr '\n' ' '))"
    exit 2
  fi
  rm -rf "$T/b" && mkdir -p "$T/b" && tar xf "$T/bundle.tar" -C "$T/b" && rm "$T/bundle.tar"
  rm -rf "$DATA" && mv "$T/b/data" "$DATA"
  local t0; t0=$(date +%s)
  if [ -n "${QV_LEASE_SETUP:-}" ]; then  # tests: a stand-in for the venvs' creation
    (cd "$REPO" && bash -c "$QV_LEASE_SETUP") 2>&1 | tee -a "$L/lease.log"
  else
    # what `make setup WHEELHOUSE=$WH SYSTEM_SITE=1 ORCH_REQS=requirements/orchestrator.txt ARGS="$GPU_ENV"` does, without
    # make (not promised on the image): the orchestrator venv, this checkout on its path, then the stage venvs
    # shellcheck disable=SC2086  # GPU_ENV is words
    (cd "$REPO" && python3 src/quantverdict/processes/venv_build.py .venv requirements/orchestrator.txt \
        --wheelhouse "$WH" --system-site-packages \
      && printf '%s\n%s\n' "$REPO/src" "$REPO" > "$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/quantverdict.pth" \
      && .venv/bin/python -m quantverdict.processes.envs $GPU_ENV "data.offline_root=$DATA") 2>&1 | tee -a "$L/lease.log"
  fi
  [ "${PIPESTATUS[0]}" -eq 0 ] || { say "install: creating the venvs failed"; exit 2; }
  say "install: the orchestrator and stage venvs created offline in $(( $(date +%s) - t0 )) s (wheelhouse $(du -sh "$WH" 2>/dev/null | cut -f1))"
  if [ -z "${QV_LEASE_SITE_SERVE:-}" ]; then
    SITE_SERVE=$( (ls -d "$QV_ENV_ROOT"/serve-*/lib/python3*/site-packages 2>/dev/null || true) | head -1)
  fi
  restore_jit_cache "$T/b/jit-cache.tar.gz"
  touch "$L/installed"
  say "install: done; data at $DATA; $(nvidia-smi --query-gpu=name,uuid --format=csv,noheader 2>/dev/null || echo 'no nvidia-smi')"
}

serve_key() {  # the installed serve packages' names and versions (*.dist-info under $SITE_SERVE), hashed
  { find "$SITE_SERVE" -maxdepth 1 -name '*.dist-info' -printf '%f\n' 2>/dev/null || true; } | LC_ALL=C sort | sha256sum | cut -c1-16
}

image_key() {  # what the machine's image brings to a JIT build: torch and the CUDA it was built for, the GPU; hashed
  # (e.g. "2.11.0+cu130 13.0" and "NVIDIA H200, 9.0": lines one can write down from the install's output)
  { python3 -c 'import torch; print(torch.__version__, torch.version.cuda)' 2>/dev/null || echo "no torch"
    nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader 2>/dev/null || true
  } | sha256sum | cut -c1-16
}

wheel_key() {  # wheel_key DIR: serve_key's hash computed from the wheels in DIR (here, before they travel)
  local w
  command -v unzip > /dev/null || { echo "lease.sh wheel-key: no unzip on PATH" >&2; return 2; }
  for w in "$1"/*.whl; do
    { unzip -Z1 "$w" || true; } | awk -F/ '/^[^\/]+\.dist-info\//{print $1; exit}'
  done | LC_ALL=C sort | sha256sum | cut -c1-16
}

restore_jit_cache() {  # restore_jit_cache TGZ: an earlier lease's <cache root>/vllm, brought in by the bundle
  # the install itself always stands: a run without the cache only starts slower
  local tgz="$1" tmp="$JIT.restore" key ikey
  if [ ! -f "$tgz" ]; then
    say "install: no JIT cache in the bundle (.devcache/jit-cache.tar.gz here): the first server builds FlashInfer's sampler"
    return 0
  fi
  if ! { rm -rf "$tmp" && mkdir -p "$tmp" && tar xzf "$tgz" -C "$tmp"; }; then
    say "install: the bundle's JIT cache did not unpack whole: left out, the first server builds FlashInfer's sampler"
    rm -rf "$tmp" || true; return 0
  fi
  # a cache built against other serve packages (another vLLM or FlashInfer) or another image (torch, its CUDA, the GPU)
  # could load a stale library: pack_jit_cache stores both keys, and only the same ones are restored
  key=$(serve_key) ikey=$(image_key)
  if [ "$(cat "$tmp/serve.key" 2>/dev/null)" != "$key" ] || [ "$(cat "$tmp/image.key" 2>/dev/null)" != "$ikey" ]; then
    say "install: the bundle's JIT cache was built beside other packages (serve key '$(cat "$tmp/serve.key" 2>/dev/null)', image key '$(cat "$tmp/image.key" 2>/dev/null)'; here '$key', '$ikey'): left out"
    rm -rf "$tmp" || true; return 0
  fi
  if ! { rm -rf "$JIT" && mkdir -p "$(dirname "$JIT")" && mv "$tmp" "$JIT"; }; then
    say "install: the bundle's JIT cache could not be moved into $JIT: left out"
    rm -rf "$tmp" "$JIT" || true; return 0
  fi
  # FlashInfer runs ninja before loading a kernel library, and ninja rebuilds an output older than one of its inputs
  # (on disk and in its build log). The inputs are FlashInfer's sources under $SITE_SERVE, which pip has just written
  # with today's time; the carried outputs keep the earlier lease's (to the nanosecond: pax headers, below). Dating the
  # installed files back keeps the outputs newer; the command lines ninja also compares are the same paths every lease.
  # Python sources keep their time: a .py dated back would make every cached bytecode file stale.
  if find "$SITE_SERVE" ! -name '*.py' -exec touch -h -d '2000-01-01 00:00:00 UTC' {} +; then
    say "install: JIT caches restored into $JIT ($(du -sh "$JIT" | cut -f1)); $SITE_SERVE dated 2000-01-01 for ninja"
  else
    say "install: JIT caches restored into $JIT, but dating $SITE_SERVE back failed: FlashInfer may rebuild its sampler"
  fi
}

out_room() {  # out_room OUT: "FILES BYTES" still free under OUT, one file and 1 MiB kept for lease.log
  local n b
  n=$(find "$1" -maxdepth 1 -type f ! -name lease.log | wc -l)
  b=$(find "$1" -maxdepth 1 -type f ! -name lease.log -printf '%s\n' | awk '{s += $1} END {print s + 0}')
  echo "$(( OUT_FILES - 1 - n )) $(( OUT_BYTES - 1048576 - b ))"
}

fits() {  # fits SIZE OUT: status 0 when SIZE bytes, cut into 15-MiB pieces, fit the room left under OUT
  local files bytes
  read -r files bytes <<< "$(out_room "$2")"
  [ $(( ($1 + PIECE - 1) / PIECE )) -le "$files" ] && [ "$1" -le "$bytes" ]
}

place() {  # place FILE OUT NAME WHAT: FILE -> OUT/NAME, cut into OUT/NAME.00, .01 ... (15 MiB) when larger, if OUT has room
  local f="$1" out="$2" name="$3" what="$4" size pieces files bytes
  size=$(stat -c %s "$f")
  pieces=$(( (size + PIECE - 1) / PIECE ))
  if ! fits "$size" "$out"; then
    read -r files bytes <<< "$(out_room "$out")"
    say "collect: $what left out: $(( size / 1048576 )) MiB in $pieces piece(s), \$OUT has room for $files file(s) and $(( bytes / 1048576 )) MiB"
    rm -f "$f"; return 1
  fi
  if [ "$pieces" -gt 1 ]; then
    split -b "$PIECE" -d -a 2 "$f" "$out/$name." && rm -f "$f"
  else
    mv "$f" "$out/$name"
  fi
}

tar_jit() {  # tar_jit FILE [EXCLUDES...]: <cache root>/vllm -> FILE; status 0 only for a whole archive
  local f="$1" rc=0
  shift
  # --format=posix keeps sub-second mtimes, which ninja's build and deps logs compare with the files'
  tar czf "$f" --format=posix "$@" -C "$JIT" . || rc=$?
  [ "$rc" -eq 0 ] && return 0
  # exit 1: a file changed while read (a server still writing its caches), and it may be cut short: once more
  sleep 5; rc=0
  tar czf "$f" --format=posix "$@" -C "$JIT" . || rc=$?
  return "$rc"
}

pack_jit_cache() {  # pack_jit_cache OUT: <cache root>/vllm -> OUT/jit-cache.tar.gz, or its pieces .00, .01, ...
  # packed outside OUT and moved in whole: a collect killed halfway leaves no cut archive to be carried
  local out="$1" tmp="$T/jit-cache.tmp.tar.gz" size
  rm -f "$out"/jit-cache.tar.gz* "$tmp"
  if [ ! -d "$JIT" ]; then say "collect: no JIT caches at $JIT (no server has run)"; return 0; fi
  if ! fits 1 "$out"; then say "collect: JIT caches left out: \$OUT holds as many files as come back"; return 0; fi
  serve_key > "$JIT/serve.key"; image_key > "$JIT/image.key"
  if ! tar_jit "$tmp"; then
    say "collect: JIT caches left out: tar failed twice (files changing under it: a server running?)"
    rm -f "$tmp"; return 0
  fi
  size=$(stat -c %s "$tmp")
  if [ "$size" -gt $(( 2 * PIECE )) ] || ! fits "$size" "$out"; then
    # torch.compile's artifacts are keyed by checkpoint and grow with each one; FlashInfer's and Triton's builds are
    # what every later server shares: keep those
    say "collect: JIT caches $(( size / 1048576 )) MiB packed: too much to bring back, packed again without torch_compile_cache"
    if ! tar_jit "$tmp" --exclude=./torch_compile_cache; then
      say "collect: JIT caches left out: tar failed twice"; rm -f "$tmp"; return 0
    fi
    size=$(stat -c %s "$tmp")
  fi
  if [ "$size" -gt $(( 2 * PIECE )) ]; then
    say "collect: JIT caches left out: $(( size / 1048576 )) MiB packed, more than two pieces"; rm -f "$tmp"; return 0
  fi
  place "$tmp" "$out" jit-cache.tar.gz "JIT caches" || return 0
  say "collect: JIT caches ($(du -sh "$JIT" | cut -f1), $(( size / 1048576 )) MiB packed) in $(ls "$out"/jit-cache.tar.gz* | wc -l) file(s)"
}

queue() {
  local line="$1" name est kind
  read -r name est kind _ <<< "$line"
  [[ "$name" =~ ^[A-Za-z0-9._-]+$ ]] || { say "queue: step name '$name' (letters, digits, . _ - only)"; exit 2; }
  case "$name" in jit-cache*|lease|lease.*) say "queue: step name '$name' is collect's own (jit-cache*, lease): choose another"; exit 2 ;; esac
  [[ "$est" =~ ^[0-9]+$ ]] || { say "queue $name: EST_S '$est' is not a number of seconds"; exit 2; }
  case "$kind" in grid|fidelity) ;; *) say "queue $name: kind '$kind' (allowed: grid, fidelity)"; exit 2 ;; esac
  echo "$line" >> "$L/queue"
  say "queued: $line"
}

runner_alive() { [ -f "$L/runner.pid" ] && kill -0 "$(cat "$L/runner.pid")" 2>/dev/null; }

go() {
  if runner_alive; then say "go: the runner is already running (pid $(cat "$L/runner.pid"))"; return; fi
  rm -f "$L/queue.done"
  setsid bash "${BASH_SOURCE[0]}" _run >> "$L/runner.log" 2>&1 < /dev/null &
  echo $! > "$L/runner.pid"
  say "go: runner pid $!, lease end $(date -u -d "@$(lease_end)" +%H:%M:%S)"
}

newest_record() {  # the newest record.json of job $1 under $RES
  find "$RES" -path "*/multirun/*/$1/record.json" -printf '%T@ %p\n' 2>/dev/null | sort -n | tail -1 | cut -d' ' -f2-
}

_run() {  # the runner: every queued step in order, each only if the lease has its EST_S left
  local i=0 line name est kind rest now left rc record
  export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
  cd "$REPO"
  set -f  # the overrides are split into words but never globbed: bench.concurrencies=[16,64,256] stays as written
  while true; do
    i=$(( i + 1 ))
    line=$(sed -n "${i}p" "$L/queue" 2>/dev/null)
    [ -n "$line" ] || break
    read -r name est kind rest <<< "$line"
    now=$(date +%s); left=$(( $(lease_end) - now ))
    if [ "$left" -lt "$est" ]; then
      say "step $name: skipped, ${left} s of the lease left < ${est} s it needs"
      echo "$name skipped" >> "$L/steps"
      continue
    fi
    say "step $name: starts (${left} s left, needs ${est} s): $kind $rest"
    mkdir -p "$RES/$name"
    rc=0
    if [ "$kind" = grid ]; then
      # shellcheck disable=SC2086  # the overrides are words
      "$PY" -m pipelines.run -m $GPU_ENV "data.offline_root=$DATA" "paths.output_root=$RES/$name" $rest \
        > "$RES/$name/step.log" 2>&1 || rc=$?
    else
      read -r job rest <<< "$rest"
      record=$(newest_record "$job")
      if [ -z "$record" ]; then
        say "step $name: no record of job $job under $RES"; rc=2
      else
        # shellcheck disable=SC2086
        "$PY" -m tools.bench.fidelity "$record" --out "$RES/$name" $rest > "$RES/$name/step.log" 2>&1 || rc=$?
      fi
    fi
    say "step $name: exit $rc after $(( $(date +%s) - now )) s"
    echo "$name $rc" >> "$L/steps"
  done
  say "queue done"
  touch "$L/queue.done"
}

wait_for() {
  local limit="$1" t0 seen=0 n
  t0=$(date +%s)
  while true; do
    n=$(wc -l < "$L/lease.log" 2>/dev/null || echo 0)
    [ "$n" -gt "$seen" ] && { sed -n "$(( seen + 1 )),${n}p" "$L/lease.log"; seen=$n; }
    [ -f "$L/queue.done" ] && break
    runner_alive || { echo "wait: the runner is not running (queue not done): see runner.log"; break; }
    [ $(( $(date +%s) - t0 )) -ge "$limit" ] && { echo "wait: ${limit} s passed, the runner goes on"; break; }
    [ "$(date +%s)" -ge "$(lease_end)" ] && { echo "wait: the lease's end is near: collecting now"; break; }
    sleep 5
  done
  for f in "$RES"/*/step.log; do
    if [ -f "$f" ]; then echo "--- $f"; tail -n 4 "$f"; fi
  done
  collect
}

pack() {  # pack FILE NAME [EXCLUDES...]: step folder NAME -> FILE (a .tar.gz), never failing the collect
  # a step still running changes its files while tar reads them: tar exits 1 and its archive holds each file as it
  # was read, a file being written possibly cut short (seen on the fifth lease: `set -e` ended the collect there
  # and the other steps never came back); the next collect packs the step again
  local f="$1" name="$2" rc=0
  shift 2
  tar czf "$f" --warning=no-file-changed -C "$RES" --exclude='mlartifacts' --exclude='*.safetensors' \
    "$@" "$name" || rc=$?
  case "$rc" in
    0) ;;
    1) say "collect $name: files changed while packed (the step still runs; a file in the archive may be cut short)" ;;
    *) say "collect $name: tar exit $rc (its archive may be incomplete)" ;;
  esac
}

collect() {
  # what comes back from $OUT: 8 files of at most 16 MiB, 64 MiB together. The steps first, in order, each packed
  # outside $OUT and moved in (cut into 15-MiB pieces, NAME.tar.gz.00, .01 ..., when still too large), then lease.log,
  # then the JIT caches in what room is left, then lease.log again with what collect said
  local out="${OUT:-$T/qvout}" d name f
  mkdir -p "$out"
  rm -f "$out"/*.tar.gz "$out"/*.tar.gz.[0-9][0-9] "$out/lease.log"
  shopt -s nullglob
  for d in "$RES"/*/; do
    name=$(basename "$d") f="$T/$name.tmp.tar.gz"
    pack "$f" "$name"
    if [ "$(stat -c %s "$f" 2>/dev/null || echo 0)" -gt "$PIECE" ]; then
      # the per-request result files beyond c=1 stay there
      pack "$f" "$name" --exclude='conc-[0-9][0-9]*_r[0-9].json' --exclude='rate-*_r[0-9].json'
      say "collect $name: result files beyond c=1 left out (over 15 MiB)"
    fi
    [ -f "$f" ] && { place "$f" "$out" "$name.tar.gz" "step $name" || true; }
  done
  cat "$L/lease.log" "$L/runner.log" > "$out/lease.log" 2>/dev/null || true
  pack_jit_cache "$out"
  cat "$L/lease.log" "$L/runner.log" > "$out/lease.log" 2>/dev/null || true
  ls -la "$out"
}

[ $# -gt 0 ] || { sed -n '2,30p' "${BASH_SOURCE[0]}"; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    stash|install|go|collect|_run) "$1"; shift ;;
    queue) [ $# -ge 2 ] || { echo "queue needs one quoted \"NAME EST_S KIND ARGS...\"" >&2; exit 2; }; queue "$2"; shift 2 ;;
    wheel-key) [ -d "${2:-}" ] || { echo "wheel-key needs a folder of wheels" >&2; exit 2; }; wheel_key "$2"; exit 0 ;;
    wait) [[ "${2:-}" =~ ^[0-9]+$ ]] || { echo "wait needs a number of seconds" >&2; exit 2; }; wait_for "$2"; shift 2 ;;
    *) echo "lease.sh: unknown verb '$1' (allowed: stash, install, queue, go, wait, collect, wheel-key)" >&2; exit 2 ;;
  esac
done
