"""Two grids launched at the same instant on one host, with the same output root and the same default server port:
both finish, in two output folders, with two vLLM servers on two ports, each in its own MLflow experiment.

Each grid is one served job (``tiny-llama-shape`` x bf16, a two-prompt sweep, no evaluation), started by its own
``python -m pipelines.run -m`` process. Both jobs ask for ``bench.server.port=8765`` (the default, not strict):
whichever holds it first keeps it and the other takes the next free port (or both move up, when another program
on this host listens on 8765). Checked by hand-derived rules: two multirun folders (the folder name holds the
grid's pid); each record ``ok`` and its ``speed.server`` naming the port asked for and a port of its own, the one
its server log says it listened on; each experiment holding exactly its own job's run.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from clihelp import command
from quantverdict.config.compose import PROJECT_ROOT
from quantverdict.results.record import find_records, load

# serial: the two grids must hold 8765 at the same time; a loaded host that delays one grid's server past the other's
# end lets both take the same port
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.serial]

CHEAP = [
    "model=tiny-llama-shape",
    "scheme=bf16",
    "resume=false",  # the same job in both grids: neither may reuse the other's record
    "eval.enabled=false",
    "bench.num_prompts=2",
    "bench.warmup_prompts=1",
    "bench.min_duration_s=0",
    "bench.input_len=32",
    "bench.output_len=8",
    "bench.rates=[inf]",
    "bench.server.kv_cache_space_gib=1",
]


def test_two_grids_at_once_take_two_ports_and_two_folders(
    tmp_path: Path, stage_envs: dict, embedded_model: dict
) -> None:
    from mlflow import MlflowClient

    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    grids = {}
    for name in ("grid-a", "grid-b"):  # started back to back, before either has done anything
        log = open(tmp_path / f"{name}.log", "w")  # noqa: SIM115 - closed below
        proc = subprocess.Popen(
            command(tmp_path, *CHEAP, f"tracking.experiment={name}", multirun=True),
            cwd=PROJECT_ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        grids[name] = (proc, log)
    for name, (proc, log) in grids.items():
        rc = proc.wait(timeout=1200)
        log.close()
        assert rc == 0, (tmp_path / f"{name}.log").read_text()[-5000:]

    folders = sorted((tmp_path / "multirun").iterdir())
    assert len(folders) == 2  # <time>-<pid>: two grids of the same second never share one
    assert {f.name.rsplit("-", 1)[1] for f in folders} == {str(p.pid) for p, _ in grids.values()}
    recs = {r["config"]["tracking"]["experiment"]: r for r in map(load, find_records(tmp_path / "multirun"))}
    assert set(recs) == {"grid-a", "grid-b"}
    ports = {}
    for name, rec in recs.items():
        assert rec["status"] == "ok", rec.get("error")
        server = rec["speed"]["server"]
        assert server["requested_port"] == 8765 and server["strict_port"] is False and server["start_attempts"] >= 1
        assert server["port"] >= 8765
        # the port recorded is the one the server log says it listened on
        text = (Path(rec["job"]["output_dir"]) / "vllm_server.log").read_text(errors="replace")
        assert set(re.findall(r"http://127\.0\.0\.1:(\d+)", text)) == {str(server["port"])}, name
        ports[name] = server["port"]
    attempts = {name: rec["speed"]["server"]["start_attempts"] for name, rec in recs.items()}
    print(f"two grids at once: ports {ports}, server starts {attempts}")
    assert ports["grid-a"] != ports["grid-b"], ports

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")  # the one store both grids share
    for name, rec in recs.items():
        exp = client.get_experiment_by_name(name)
        assert exp is not None
        jobs = [r for r in client.search_runs([exp.experiment_id]) if "config_hash" in r.data.tags]
        assert [(r.info.run_name, r.info.status) for r in jobs] == [("tiny-llama-shape/bf16", "FINISHED")]
        assert jobs[0].data.tags["output_dir"] == rec["job"]["output_dir"]
