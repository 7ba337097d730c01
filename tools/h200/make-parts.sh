#!/usr/bin/env bash
# Runs HERE (a developer's machine, with PyPI), from the repository root: everything one H200 lease needs, cut
# into parts that each travel beside the working tree in one device `run` call (64 MiB a call, the tree included).
#
#   bash tools/h200/make-parts.sh
#
# 1. the wheelhouse: `python -m quantverdict.processes.wheelhouse --env gpu --orchestrator --installed
#    tools/h200/image-freeze.txt --python-version 3.12 --pip-python <a python3.12 here, QV_PIP_PYTHON>` (every wheel the stage venvs and the orchestrator need that the
#    machine's image, whose `pip list --format=freeze` is tools/h200/image-freeze.txt, does not already have) into
#    .devcache/wheelhouse (git-ignored through .git/info/exclude; never commit it), linked into the bundle;
# 2. the offline data (../shared/data, read-only there) is copied into the bundle as data/ (the H200 machine
#    cannot see ../shared: `lease.sh install` puts it at /tmp/qvdata, the jobs' data.offline_root);
# 3. .devcache/jit-cache.tar.gz, when there, goes in as jit-cache.tar.gz: an earlier lease's JIT caches, joined from its
#    $OUT (`cat /work/.device/NN/jit-cache.tar.gz* > .devcache/jit-cache.tar.gz`, NN the lease's last call), which
#    `lease.sh install` restores into the cache root when it was built beside the same serve packages and image;
# 4. the bundle is cut into parts of (62 MiB - the tree that travels), at most 48 MiB, in .devcache/NN/part.NN,
#    with .devcache/00/bundle.sha256 to check the reassembled bundle there.
#
# It prints the `run` calls of the lease (tools/h200/lease.sh runs them there).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
SHARED="$(cd .. && pwd)/shared"
[ -d "$SHARED/data" ] || { echo "make-parts: no $SHARED/data beside the checkout" >&2; exit 2; }
D=.devcache
mkdir -p "$D"
grep -qx '/.devcache/' .git/info/exclude 2>/dev/null || { mkdir -p .git/info; echo '/.devcache/' >> .git/info/exclude; }
[ -x .venv/bin/python ] || { echo "make-parts: no .venv here: run make setup first" >&2; exit 2; }
# pip reads environment markers for the interpreter it runs in: resolve with a Python 3.12, the machine's
PY312="${QV_PIP_PYTHON:-$( (ls -d "$HOME"/.pyenv/versions/3.12*/bin/python3.12 2>/dev/null || true) | tail -1)}"
.venv/bin/python -m quantverdict.processes.wheelhouse --out "$D/wheelhouse" --env gpu --orchestrator \
  --installed tools/h200/image-freeze.txt --python-version 3.12 ${PY312:+--pip-python "$PY312"}
rm -rf "$D"/[0-9][0-9] "$D/w" && mkdir -p "$D/w"
cp -al "$D/wheelhouse" "$D/w/wheelhouse" && rm -rf "$D/w/wheelhouse/.built" "$D/w/wheelhouse/.reports"
cp -r --no-preserve=mode "$SHARED/data" "$D/w/data"
jit="no JIT caches (no $D/jit-cache.tar.gz: the lease's first server builds FlashInfer's sampler, 76-123 s)"
if [ -f "$D/jit-cache.tar.gz" ]; then
  tar tzf "$D/jit-cache.tar.gz" > /dev/null || { echo "make-parts: $D/jit-cache.tar.gz is not a whole gzip tar" >&2; exit 2; }
  cp "$D/jit-cache.tar.gz" "$D/w/jit-cache.tar.gz"
  jit="the JIT caches of $D/jit-cache.tar.gz ($(du -h "$D/jit-cache.tar.gz" | cut -f1), $(date -u -r "$D/jit-cache.tar.gz" +%F)); install restores them beside the same serve packages only"
fi
# the working tree that travels with every call: tracked files and untracked ones git does not ignore
tree_kib=$( { git ls-files -z; git ls-files -z --others --exclude-standard; } | (xargs -0 -r du -k 2>/dev/null || true) | awk '{s += $1} END {print s + 0}')
part_mib=$(( 62 - (tree_kib + 1023) / 1024 ))
[ "$part_mib" -gt 48 ] && part_mib=48
[ "$part_mib" -ge 8 ] || { echo "make-parts: the working tree takes $(( tree_kib / 1024 )) MiB: no room for a part" >&2; exit 2; }
tar cf "$D/bundle.tar" -C "$D/w" .
sum=$(sha256sum "$D/bundle.tar" | cut -c1-64)
( cd "$D" && split -b "${part_mib}M" -d -a 2 bundle.tar part. && for p in part.*; do n=${p#part.}; mkdir -p "$n"; mv "$p" "$n/"; done )
rm "$D/bundle.tar"
echo "$sum  bundle.tar" > "$D/00/bundle.sha256"
n_parts=$(ls -d "$D"/[0-9][0-9] | wc -l)
echo "bundle: $(du -sh "$D/w" | cut -f1) (data included) in $n_parts parts of ${part_mib} MiB; the tree travels with $(( tree_kib / 1024 )) MiB"
echo "bundle: $jit"
echo "the lease, one call after another (the machine goes back 30 s after a call returns):"
# the first call names the kind: a run that names none starts an H100 (since 2026-12-02); nvidia-h200 may still
# give an H100, which `date +%s; nvidia-smi -L` shows
first=1
for p in "$D"/[0-9][0-9]; do
  if [ "$first" = 1 ]; then
    echo "  run(command='date +%s; nvidia-smi -L; bash tools/h200/lease.sh stash', carry=['.devcache/$(basename "$p")'], kind='nvidia-h200')"
    first=0
  else
    echo "  run(command='bash tools/h200/lease.sh stash', carry=['.devcache/$(basename "$p")'])"
  fi
done
echo "  run(command='QV_LEASE_END=<first epoch + its budget_left_s - 60> bash tools/h200/lease.sh install queue \"NAME EST_S grid OVERRIDES...\" go wait 420')   # the install takes ~1-2 min of the call's 600 s"
echo "  run(command='bash tools/h200/lease.sh wait 560')   # until it prints 'queue done'; then give_back"
echo "  here: cat /work/.device/<last call>/jit-cache.tar.gz* > $D/jit-cache.tar.gz   # for the next lease's bundle"
