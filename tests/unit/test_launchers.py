"""``hydra/launcher=ray`` and ``hydra/launcher=submitit_slurm``: they compose, and each job asks for the GPUs
its server shards over (``bench.server.tensor_parallel_size`` on cuda, none on cpu) and a CPU share.

The Slurm request is checked in the ``sbatch`` script submitit itself writes for the launcher's parameters
(no Slurm here to submit it): the parameters go through the same renaming the launcher does
(``SlurmLauncher.launch``: base keys as they are, the others prefixed ``slurm_``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import submitit
from hydra import compose, initialize_config_dir
from hydra.utils import get_class, instantiate
from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
from omegaconf import DictConfig, OmegaConf
from submitit.slurm import slurm

from quantverdict.config.compose import CONF_DIR

pytestmark = pytest.mark.filterwarnings("ignore:.*is validated against ConfigStore schema:UserWarning")


def _compose(*overrides: str) -> DictConfig:
    with initialize_config_dir(str(CONF_DIR), version_base=None):
        return compose("config", list(overrides), return_hydra_config=True)


def _sweep_dir(cfg: DictConfig, tmp_path: Path) -> None:
    # the launcher's interpolations of hydra.sweep.dir / hydra.job.name need a job's runtime values
    cfg.hydra.sweep.dir = str(tmp_path)
    cfg.hydra.job.name = "run"


@pytest.mark.parametrize(
    ("overrides", "gpus"),
    [
        ([], 0),  # the CPU default: no GPU asked for (a local Ray on a CPU machine would never place the job)
        (["env.device=cuda"], 1),
        (["env.device=cuda", "bench.server.tensor_parallel_size=2"], 2),
    ],
)
def test_ray_job_asks_for_tp_gpus_and_one_cpu(overrides: list[str], gpus: int) -> None:
    cfg = _compose("hydra/launcher=ray", *overrides)
    launcher = cfg.hydra.launcher
    assert get_class(launcher._target_).__name__ == "RayLauncher"
    remote = OmegaConf.to_container(launcher.ray.remote, resolve=True)
    assert remote == {"num_gpus": gpus, "num_cpus": 1, "max_calls": 1, "max_retries": 0}
    init = OmegaConf.to_container(launcher.ray.init, resolve=True)
    # a local instance by default; object_store_memory present (null), so the launcher's 75 MB default is not
    # added: ray.init refuses any object_store_memory when it joins a cluster (address=auto)
    assert init["address"] is None and "object_store_memory" in init and init["object_store_memory"] is None


def test_ray_joins_an_existing_cluster_by_address() -> None:
    cfg = _compose("hydra/launcher=ray", "hydra.launcher.ray.init.address=auto")
    init = OmegaConf.to_container(cfg.hydra.launcher.ray.init, resolve=True)
    assert isinstance(init, dict)
    assert init["address"] == "auto"
    # ray.init(address=...) refuses num_cpus, num_gpus and object_store_memory other than None
    assert init["num_cpus"] is None and init["num_gpus"] is None and init["object_store_memory"] is None


def _sbatch(cfg: DictConfig, tmp_path: Path) -> str:
    """The sbatch script submitit writes for the launcher's parameters: the launcher's renaming (base keys
    through submitit's generic-to-Slurm names, the rest as Slurm's own), then submitit's ``_make_sbatch_string``
    (``SlurmExecutor`` itself refuses to start without ``srun``)."""
    _sweep_dir(cfg, tmp_path)
    launcher = instantiate(cfg.hydra.launcher)
    assert type(launcher).__name__ == "SlurmLauncher"
    params: dict[str, Any] = dict(launcher.params)
    folder = params.pop("submitit_folder")
    params.pop("max_num_timeout")  # an executor init key, not an sbatch line
    base = set(OmegaConf.structured(BaseQueueConf).keys())
    generic = submitit.SlurmExecutor._equivalence_dict()
    sbatch = {str(generic.get(k, k)) if k in base else k: v for k, v in params.items()}
    return str(slurm._make_sbatch_string(command="python -m pipelines.run", folder=folder, **sbatch))


def test_slurm_job_asks_for_tp_gpus(tmp_path: Path) -> None:
    two = _sbatch(
        _compose("hydra/launcher=submitit_slurm", "env.device=cuda", "bench.server.tensor_parallel_size=2"), tmp_path
    )
    assert "#SBATCH --gpus-per-task=2" in two
    assert "#SBATCH --cpus-per-task=8" in two and "#SBATCH --ntasks-per-node=1" in two and "#SBATCH --nodes=1" in two
    assert "#SBATCH --time=240" in two
    one = _sbatch(_compose("hydra/launcher=submitit_slurm", "env.device=cuda"), tmp_path)
    assert "#SBATCH --gpus-per-task=1" in one
    cpu = _sbatch(_compose("hydra/launcher=submitit_slurm"), tmp_path)
    assert "--gpus-per-task=0" in cpu or "--gpus-per-task" not in cpu


def test_plain_launcher_stays_the_default() -> None:
    cfg = _compose()
    assert cfg.hydra.launcher._target_ == "hydra._internal.core_plugins.basic_launcher.BasicLauncher"


def test_tracking_server_config_is_an_http_uri_with_the_servers_artifact_store(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("QV_MLFLOW_URI", raising=False)
    cfg = _compose("tracking=server")
    assert cfg.tracking.uri == "http://127.0.0.1:5000" and cfg.tracking.artifact_location is None
    monkeypatch.setenv("QV_MLFLOW_URI", "http://head:5000")
    assert _compose("tracking=server").tracking.uri == "http://head:5000"
