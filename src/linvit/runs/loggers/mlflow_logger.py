"""MLflow: a file store in the run folder's mlruns/ unless MLFLOW_TRACKING_URI names a server
(`mlflow ui --backend-store-uri <run>/mlruns` shows it)."""
from __future__ import annotations

import os
import time
from pathlib import Path

from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from linvit.runs.loggers import tracking_uri


class MlflowLogger:
    def __init__(self, folder: Path, run_name: str, config: dict):
        self.client = MlflowClient(tracking_uri=tracking_uri(folder))
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME", "linvit")
        found = self.client.get_experiment_by_name(name)
        experiment = found.experiment_id if found else self.client.create_experiment(name)
        self.run_id = self.client.create_run(experiment, run_name=run_name).info.run_id
        self.client.log_dict(self.run_id, config, "config.json")

    def log(self, scalars: dict[str, float], step: int) -> None:
        now = int(time.time() * 1000)
        metrics = [Metric(key, value, now, step) for key, value in scalars.items()]
        for at in range(0, len(metrics), 1000):           # the store's batch limit
            self.client.log_batch(self.run_id, metrics=metrics[at:at + 1000])

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


def open_logger(folder: Path, run_name: str, config: dict, start_step: int) -> MlflowLogger:
    return MlflowLogger(folder, run_name, config)
