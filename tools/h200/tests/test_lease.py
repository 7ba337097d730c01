"""tools/h200/lease.sh, the H200 lease driver, run here with a stand-in interpreter (QV_LEASE_PYTHON) and a
lease root in a temporary folder (QV_LEASE_ROOT): the order of steps, the skip when the lease has too little time
left, the fidelity step finding the newest record of its job, what collect brings back and the bundle check."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import tarfile
import time
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
LEASE = ROOT / "tools" / "h200" / "lease.sh"

# a stand-in for the H200 machine's python3: `-m pipelines.run -m ... paths.output_root=R ...` writes two jobs of a
# grid (an older one first) with a checkpoint that must not come back; `-m tools.bench.fidelity RECORD --out D` writes
# which record it was given
FAKE_PY = r"""#!/usr/bin/env bash
echo "$*" >> "$QV_LEASE_ROOT/calls"
if [ "$2" = pipelines.run ]; then
  case " $* " in *" scheme=slow "*) sleep 30 ;; esac
  for a in "$@"; do case "$a" in paths.output_root=*) out="${a#paths.output_root=}" ;; esac; done
  for t in 10 11; do  # two runs of the grid, an hour apart
    job="$out/multirun/2026-12-01_$t-00-00/m_bf16"
    mkdir -p "$job/bench"
    echo x > "$job/model.safetensors"
    echo "{}" > "$job/record.json"
    touch -d "2026-12-01 $t:00:00" "$job/record.json"
  done
  exit 0
fi
if [ "$2" = tools.bench.fidelity ]; then
  shift 2; rec="$1"; shift
  [ "$1" = --out ] && mkdir -p "$2" && echo "$rec" > "$2/record_used" && exit 0
fi
exit 9
"""


def _lease(tmp: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    # QV_CACHE_ROOT: collect packs <cache root>/vllm; this machine's own cache root stays out of the tests
    full = dict(os.environ, QV_LEASE_ROOT=str(tmp), QV_LEASE_PYTHON=str(tmp / "fakepy"), OUT=str(tmp / "out"))
    full.update({"QV_CACHE_ROOT": str(tmp / "cache"), **env})
    return subprocess.run(["bash", str(LEASE), *args], env=full, capture_output=True, text=True, timeout=120)


@pytest.fixture
def lease_root(tmp_path: Path) -> Path:
    fake = tmp_path / "fakepy"
    fake.write_text(FAKE_PY)
    fake.chmod(0o755)
    return tmp_path


def test_steps_run_in_order_skip_when_the_lease_is_short_and_collect(lease_root: Path) -> None:
    end = str(int(time.time()) + 600)  # 600 s of lease left: a step that needs 100,000 s is skipped
    r = _lease(
        lease_root,
        "queue", "g1 10 grid model=m scheme=bf16",
        "queue", "big 100000 grid model=m scheme=gptq",
        "queue", "fid 10 fidelity m_bf16 --repeat 0 --concurrency 64",
        "go", "wait", "60",
        QV_LEASE_END=end,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    steps = (lease_root / "qvlease" / "steps").read_text().split("\n")
    assert steps[:3] == ["g1 0", "big skipped", "fid 0"]
    calls = (lease_root / "calls").read_text().splitlines()
    assert len(calls) == 2  # the skipped grid never started
    assert f"paths.output_root={lease_root}/qvgpu/g1 model=m scheme=bf16" in calls[0]
    wheelhouse = f"{lease_root}/b/wheelhouse"
    assert calls[0].startswith(
        f"-m pipelines.run -m env=gpu env.wheelhouse={wheelhouse} env.system_site_packages=true data.offline_root="
    )
    # the fidelity step got the newer of the two records of its job, its own --out, then its own flags
    used = (lease_root / "qvgpu" / "fid" / "record_used").read_text().strip()
    assert used == f"{lease_root}/qvgpu/g1/multirun/2026-12-01_11-00-00/m_bf16/record.json"
    assert calls[1].endswith(f"--out {lease_root}/qvgpu/fid --repeat 0 --concurrency 64")
    assert "skipped, " in r.stdout and "< 100000 s it needs" in r.stdout
    with tarfile.open(lease_root / "out" / "g1.tar.gz") as tar:
        names = tar.getnames()
    assert "g1/multirun/2026-12-01_11-00-00/m_bf16/record.json" in names
    assert not [n for n in names if n.endswith(".safetensors")]
    assert (lease_root / "out" / "lease.log").is_file()


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("a b grid x=1", "EST_S 'b' is not a number of seconds"),
        ("a 10 serve x=1", "kind 'serve' (allowed: grid, fidelity)"),
        ("a/b 10 grid x=1", "step name 'a/b'"),
    ],
)
def test_a_bad_step_is_refused_before_anything_runs(lease_root: Path, line: str, why: str) -> None:
    r = _lease(lease_root, "queue", line, "go")
    assert r.returncode == 2
    assert why in r.stdout
    assert not (lease_root / "qvlease" / "runner.pid").exists()


def test_unknown_verb_names_the_allowed_ones(lease_root: Path) -> None:
    r = _lease(lease_root, "start")
    assert r.returncode == 2
    assert "unknown verb 'start' (allowed: stash, install, queue, go, wait, collect, wheel-key)" in r.stderr


def _bundle(repo: Path, parts: dict[str, bytes], digest: str) -> None:
    for n, data in parts.items():
        d = repo / ".devcache" / n
        d.mkdir(parents=True)
        (d / f"part.{n}").write_bytes(data)
    (repo / ".devcache" / "00" / "bundle.sha256").write_text(f"{digest}  bundle.tar\n")


def test_install_refuses_a_bundle_with_a_part_missing(
    lease_root: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # a copy of the driver in a repository-shaped folder, so that `stash` finds this test's .devcache parts
    repo = tmp_path_factory.mktemp("repo")
    (repo / "tools" / "h200").mkdir(parents=True)
    (repo / "tools" / "h200" / "lease.sh").write_bytes(LEASE.read_bytes())
    whole = b"0123456789" * 1000
    _bundle(repo, {"00": whole[:6000]}, hashlib.sha256(whole).hexdigest())  # part 01 (the last 4,000 bytes) not sent
    env = dict(os.environ, QV_LEASE_ROOT=str(lease_root), OUT=str(lease_root / "out"))
    script = str(repo / "tools" / "h200" / "lease.sh")
    r = subprocess.run(["bash", script, "stash"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "stash: 1 parts" in r.stdout
    assert (lease_root / "qvlease" / "lease.t0").is_file()
    r = subprocess.run(["bash", script, "install"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "does not match bundle.sha256 (a part missing: bundle.sha256 part.00" in r.stdout


def test_wait_collects_when_the_lease_end_is_near_and_the_step_goes_on(lease_root: Path) -> None:
    # 8 s of lease left: the step (1 s needed) starts and runs 30 s; wait 60 returns at the lease's end, not at 60 s
    end = str(int(time.time()) + 8)
    t0 = time.monotonic()
    r = _lease(lease_root, "queue", "slow 1 grid scheme=slow", "go", "wait", "60", QV_LEASE_END=end)
    took = time.monotonic() - t0
    pid = int((lease_root / "qvlease" / "runner.pid").read_text())
    try:
        assert r.returncode == 0, r.stderr
        assert "wait: the lease's end is near: collecting now" in r.stdout
        assert took < 30  # the runner's step (30 s) had not finished
        assert not (lease_root / "qvlease" / "queue.done").exists()
        assert (lease_root / "out" / "slow.tar.gz").is_file()  # the step's folder so far
    finally:
        os.killpg(pid, signal.SIGTERM)  # the runner leads its own session (setsid)


def test_a_lease_end_given_once_holds_for_the_later_calls(lease_root: Path) -> None:
    # the install call is given the end (600 s left); the next call, without it, still skips a 1,000-s step (its
    # default end, t0 + 1800 - 180 s, would have run it)
    end = str(int(time.time()) + 600)
    r = _lease(lease_root, "queue", "big 1000 grid scheme=bf16", "queue", "small 1 grid scheme=int8", QV_LEASE_END=end)
    assert r.returncode == 0, r.stderr
    assert (lease_root / "qvlease" / "lease.end").read_text().strip() == end
    r = _lease(lease_root, "go", "wait", "60")
    assert r.returncode == 0, r.stderr
    log = (lease_root / "qvlease" / "lease.log").read_text()
    assert "step big: skipped" in log and "step small: exit 0" in log
    bad = _lease(lease_root, "collect", QV_LEASE_END="soon")
    assert bad.returncode == 2 and "QV_LEASE_END 'soon' is not epoch seconds" in bad.stderr


def test_collect_goes_on_when_a_running_steps_files_change_under_tar(lease_root: Path) -> None:
    # tar exits 1 ("file changed as we read it") on a step still running; the collect must still pack every step
    # and the log. A stand-in tar first on PATH: the real one, then exit 1 for step "a" (exit 2 for step "c")
    r = _lease(lease_root, "queue", "a 1 grid scheme=bf16", "queue", "b 1 grid scheme=int8", "go", "wait", "60")
    assert r.returncode == 0, r.stderr
    (lease_root / "qvgpu" / "c").mkdir()
    shim = lease_root / "shim"
    shim.mkdir()
    real = subprocess.run(["bash", "-c", "command -v tar"], capture_output=True, text=True).stdout.strip()
    (shim / "tar").write_text(
        f'#!/usr/bin/env bash\n"{real}" "$@"; rc=$?\ncase "${{@: -1}}" in a) exit 1 ;; c) exit 2 ;; esac\nexit $rc\n'
    )
    (shim / "tar").chmod(0o755)
    r = _lease(lease_root, "collect", PATH=f"{shim}:{os.environ['PATH']}")
    assert r.returncode == 0, r.stderr
    for step in ("a", "b"):
        with tarfile.open(lease_root / "out" / f"{step}.tar.gz") as tar:
            names = tar.getnames()
        assert f"{step}/multirun/2026-12-01_11-00-00/m_bf16/record.json" in names
        assert not [n for n in names if n.endswith(".safetensors")]  # the checkpoint still stays there
    assert "collect a: files changed while packed (the step still runs" in r.stdout
    assert "collect b:" not in r.stdout
    assert "collect c: tar exit 2 (its archive may be incomplete)" in r.stdout
    assert (lease_root / "out" / "lease.log").is_file()


def _install_bundle_with(
    tmp_path_factory: pytest.TempPathFactory, machine: Path, site: Path, cache_root: Path, packed: bytes
) -> subprocess.CompletedProcess[str]:
    """A fresh machine (lease root `machine`) stashing and installing a one-part bundle that carries `packed`."""
    repo = tmp_path_factory.mktemp("repo")
    (repo / "tools" / "h200").mkdir(parents=True)
    (repo / "tools" / "h200" / "lease.sh").write_bytes(LEASE.read_bytes())
    w = tmp_path_factory.mktemp("w")
    (w / "data").mkdir()
    (w / "jit-cache.tar.gz").write_bytes(packed)
    bundle = tmp_path_factory.mktemp("b") / "bundle.tar"
    with tarfile.open(bundle, "w") as tar:
        tar.add(w, arcname=".")
    _bundle(repo, {"00": bundle.read_bytes()}, hashlib.sha256(bundle.read_bytes()).hexdigest())
    env = dict(os.environ, QV_LEASE_ROOT=str(machine), OUT=str(machine / "out"), QV_LEASE_SITE_SERVE=str(site),
               QV_CACHE_ROOT=str(cache_root), QV_LEASE_SETUP="echo installed")  # fmt: skip
    r = subprocess.run(
        ["bash", str(repo / "tools/h200/lease.sh"), "stash"], env=env, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run(
        ["bash", str(repo / "tools/h200/lease.sh"), "install"], env=env, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stdout + r.stderr
    return r


# a FlashInfer-shaped JIT build: sources in the installed package, objects and the library in the cache root's build
# folder, one command per edge as FlashInfer's generated build.ninja has (`flashinfer/jit/core.py`, `run_ninja`)
NINJA_BUILD = """rule cc
  command = cp $in $out
build {cache}/sampling.cuda.o: cc {site}/flashinfer/data/csrc/sampling.cu
build {cache}/sampling.so: cc {cache}/sampling.cuda.o
"""


def _ninja(build_dir: Path) -> str:
    r = subprocess.run(["ninja", "-C", str(build_dir), "-d", "explain"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout + r.stderr


@pytest.mark.skipif(shutil.which("ninja") is None, reason="no ninja on PATH (FlashInfer's JIT builds with it)")
def test_the_jit_cache_one_lease_packs_spares_the_next_machine_the_build(
    lease_root: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # lease 1 builds the library, its collect packs the cache root; lease 2 is a fresh machine whose pip writes the
    # same sources at a later time: install restores the cache, and ninja must find nothing to rebuild
    site = lease_root / "site_serve"
    src = site / "flashinfer" / "data" / "csrc" / "sampling.cu"
    src.parent.mkdir(parents=True)
    src.write_text("kernel v1\n")
    (site / "flashinfer_python-0.6.14.dist-info").mkdir()
    py = site / "flashinfer" / "jit" / "core.py"  # Python sources keep their time (bytecode stays valid)
    py.parent.mkdir(parents=True)
    py.write_text("x = 1\n")
    build = lease_root / "cache" / "vllm" / "flashinfer" / ".cache" / "flashinfer" / "90a" / "cached_ops" / "sampling"
    build.mkdir(parents=True)
    (build / "build.ninja").write_text(NINJA_BUILD.format(cache=build, site=site))
    assert "sampling.so" in _ninja(build)  # built
    assert "no work to do" in _ninja(build)
    r = _lease(lease_root, "collect", QV_LEASE_SITE_SERVE=str(site))
    assert r.returncode == 0, r.stderr
    assert "collect: JIT caches (" in r.stdout and "in 1 file(s)" in r.stdout
    packed = (lease_root / "out" / "jit-cache.tar.gz").read_bytes()

    # the next machine: no cache, the package installed anew (same bytes, a later time), the bundle carrying the cache
    shutil.rmtree(lease_root / "cache")
    time.sleep(0.05)
    src.write_text("kernel v1\n")
    py_mtime = py.stat().st_mtime
    r = _install_bundle_with(tmp_path_factory, lease_root / "m2", site, lease_root / "cache", packed)
    assert "install: JIT caches restored into" in r.stdout
    assert (build / "sampling.so").read_text() == "kernel v1\n"
    assert "no work to do" in _ninja(build)
    assert py.stat().st_mtime == py_mtime and src.stat().st_mtime < 10**9  # 2000-01-01 is 946,684,800
    # and a source that really changed is still rebuilt
    src.write_text("kernel v2\n")
    assert "sampling.so" in _ninja(build) and (build / "sampling.so").read_text() == "kernel v2\n"


def test_a_jit_cache_built_with_other_serve_packages_is_not_restored(
    lease_root: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # built next to vLLM 0.26.0; the next machine installs 0.27.0: its libraries may not match, so none is restored
    site = lease_root / "site_serve"
    (site / "vllm-0.26.0.dist-info").mkdir(parents=True)
    lib = lease_root / "cache" / "vllm" / "flashinfer" / "sampling.so"
    lib.parent.mkdir(parents=True)
    lib.write_text("built against 0.26.0\n")
    r = _lease(lease_root, "collect", QV_LEASE_SITE_SERVE=str(site))
    assert "in 1 file(s)" in r.stdout, r.stdout + r.stderr
    packed = (lease_root / "out" / "jit-cache.tar.gz").read_bytes()

    site2 = lease_root / "site2"
    (site2 / "vllm-0.27.0.dist-info").mkdir(parents=True)
    cache2 = lease_root / "cache2"
    r = _install_bundle_with(tmp_path_factory, lease_root / "m2", site2, cache2, packed)
    assert "built beside other packages" in r.stdout and "left out" in r.stdout
    assert not (cache2 / "vllm" / "flashinfer").exists()
    # the same packages: restored
    r = _install_bundle_with(tmp_path_factory, lease_root / "m3", site, cache2, packed)
    assert "install: JIT caches restored into" in r.stdout, r.stdout
    assert (cache2 / "vllm" / "flashinfer" / "sampling.so").read_text() == "built against 0.26.0\n"


def test_collect_keeps_the_jit_cache_within_what_out_brings_back(lease_root: Path) -> None:
    # $OUT brings back at most 8 files, 16 MiB each, 64 MiB together: torch.compile's artifacts (incompressible here,
    # 31 MiB) go first, FlashInfer's build stays; with no file left for it, the cache stays behind, and says so
    jit = lease_root / "cache" / "vllm"
    (jit / "torch_compile_cache").mkdir(parents=True)
    (jit / "torch_compile_cache" / "artifact").write_bytes(os.urandom(31 * 1024 * 1024))
    (jit / "flashinfer").mkdir()
    (jit / "flashinfer" / "sampling.so").write_bytes(b"\0" * 4096)
    r = _lease(lease_root, "collect")
    assert r.returncode == 0, r.stderr
    assert "packed again without torch_compile_cache" in r.stdout and "in 1 file(s)" in r.stdout
    with tarfile.open(lease_root / "out" / "jit-cache.tar.gz") as tar:
        names = tar.getnames()
    assert "./flashinfer/sampling.so" in names and not any("torch_compile_cache/" in n for n in names)

    shutil.rmtree(jit / "torch_compile_cache")
    for i in range(7):  # seven step archives: with lease.log that is all eight files
        (lease_root / "qvgpu" / f"s{i}").mkdir(parents=True)
    r = _lease(lease_root, "collect")
    assert r.returncode == 0, r.stderr
    assert "JIT caches left out: $OUT holds as many files as come back" in r.stdout
    assert not list((lease_root / "out").glob("jit-cache*"))


def test_collect_says_when_there_is_no_jit_cache(lease_root: Path) -> None:
    r = _lease(lease_root, "collect")
    assert r.returncode == 0, r.stderr
    assert "collect: no JIT caches at" in r.stdout


def test_the_key_made_here_from_the_wheels_is_the_one_the_machine_gives_the_installed_packages(
    lease_root: Path,
) -> None:
    # make-parts.sh keeps a cache out of the bundle unless its serve.key (written there by collect, from the installed
    # *.dist-info folders) equals the key of the wheels about to travel: the two computations must agree
    wheels = lease_root / "wheels"
    wheels.mkdir()
    for whl, info in (
        ("foo-1.0-py3-none-any.whl", "foo-1.0.dist-info"),
        ("Bar_Baz-2.0-py3-none-any.whl", "Bar_Baz-2.0.dist-info"),
    ):
        with zipfile.ZipFile(wheels / whl, "w") as z:
            z.writestr("foo/__init__.py", "")  # the package's files come first in a wheel
            z.writestr(f"{info}/METADATA", "Name: x\n")
            z.writestr(f"{info}/RECORD", "")
    site = lease_root / "site"
    for info in ("foo-1.0.dist-info", "Bar_Baz-2.0.dist-info"):
        (site / info).mkdir(parents=True)
    (site / "foo").mkdir()
    (lease_root / "cache" / "vllm").mkdir(parents=True)
    r = _lease(lease_root, "collect", QV_LEASE_SITE_SERVE=str(site))
    assert "in 1 file(s)" in r.stdout, r.stdout + r.stderr
    with tarfile.open(lease_root / "out" / "jit-cache.tar.gz") as tar:
        f = tar.extractfile("./serve.key")
        assert f is not None
        machine_key = f.read().decode().strip()
    r = _lease(lease_root, "wheel-key", str(wheels))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == machine_key and len(machine_key) == 16
    # and another version is another key
    (wheels / "foo-1.0-py3-none-any.whl").unlink()
    with zipfile.ZipFile(wheels / "foo-1.1-py3-none-any.whl", "w") as z:
        z.writestr("foo-1.1.dist-info/METADATA", "Name: x\n")
    assert _lease(lease_root, "wheel-key", str(wheels)).stdout.strip() != machine_key


def test_a_cache_from_another_image_is_not_restored(lease_root: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    # same serve packages, but built under another torch / CUDA / GPU (image.key): left out
    site = lease_root / "site_serve"
    (site / "vllm-0.26.0.dist-info").mkdir(parents=True)
    (lease_root / "cache" / "vllm" / "flashinfer").mkdir(parents=True)
    r = _lease(lease_root, "collect", QV_LEASE_SITE_SERVE=str(site))
    assert "in 1 file(s)" in r.stdout, r.stdout + r.stderr
    src = lease_root / "unpacked"
    with tarfile.open(lease_root / "out" / "jit-cache.tar.gz") as tar:
        tar.extractall(src, filter="tar")
    (src / "image.key").write_text("0123456789abcdef\n")
    other = lease_root / "other.tar.gz"
    with tarfile.open(other, "w:gz") as tar:
        tar.add(src, arcname=".")
    r = _install_bundle_with(tmp_path_factory, lease_root / "m2", site, lease_root / "cache2", other.read_bytes())
    assert "image key '0123456789abcdef'" in r.stdout and "left out" in r.stdout
    assert not (lease_root / "cache2" / "vllm").exists()


def test_collect_cuts_a_large_step_into_pieces_and_leaves_out_what_out_cannot_bring_back(lease_root: Path) -> None:
    # a step whose server log alone is 20 MiB (incompressible) comes back in two pieces; of eight more small steps,
    # the ones past the eight files $OUT brings back (lease.log kept) are left out and named
    big = lease_root / "qvgpu" / "a-big"
    big.mkdir(parents=True)
    (big / "vllm_server.log").write_bytes(os.urandom(20 * 1024 * 1024))
    for i in range(8):
        (lease_root / "qvgpu" / f"s{i}").mkdir()
    r = _lease(lease_root, "collect")
    assert r.returncode == 0, r.stderr
    out = lease_root / "out"
    pieces = sorted(out.glob("a-big.tar.gz.*"))
    assert [p.name for p in pieces] == ["a-big.tar.gz.00", "a-big.tar.gz.01"]
    joined = lease_root / "joined.tar.gz"
    joined.write_bytes(b"".join(p.read_bytes() for p in pieces))
    with tarfile.open(joined) as tar:
        assert "a-big/vllm_server.log" in tar.getnames()
    # 8 files: the two pieces, s0-s4, lease.log; s5-s7 left out
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["a-big.tar.gz.00", "a-big.tar.gz.01", "lease.log"] + [f"s{i}.tar.gz" for i in range(5)]
    )
    for i in (5, 6, 7):
        assert f"collect: step s{i} left out" in r.stdout


@pytest.mark.parametrize("name", ["jit-cache", "jit-cache.tar.gz", "lease"])
def test_a_step_named_like_collects_own_files_is_refused(lease_root: Path, name: str) -> None:
    r = _lease(lease_root, "queue", f"{name} 10 grid scheme=bf16")
    assert r.returncode == 2 and "is collect's own" in r.stdout
