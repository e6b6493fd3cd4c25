"""Airflow DAG ``censusdp_release``: one scheduled release, as spark-submit jobs.

    check_budget >> ensure_secret >> validate_input >> topdown >> pgsr >> report

* ``check_budget``: ``censusdp budget --config CONF`` (validates the config, prints the budget).
* ``ensure_secret``: the run secret lives outside every task, in a file named by the ``secret_file``
  param or, by default, ``<Variable censusdp_secret_dir>/<run date>/run_secret`` (mode 0600);
  created once if missing, never logged. One secret per run date: the next release gets fresh noise.
* ``validate_input``: every input rule of the release, on the same Spark connection; writes nothing.
* ``topdown``: ``jobs/topdown.py`` with ``--resume`` whenever the run state of this output exists
  (the job keeps it beside the output, in ``<output>.private/``), so a retry continues from the
  last committed level. With the secret fixed outside the task, a retry redraws nothing: noise is
  keyed by (secret, mechanism, level, node, query), so a step redone after a crash gets the same
  noise.
* ``pgsr``: ``jobs/pgsr.py`` (group sizes, its own config). A retry replaces an unfinished output
  (no manifest) with ``--overwrite``: same secret, same input, hence the same noise.
* ``report``: logs ρ, ε, nodes, checks and timings from each ``manifest.json`` (no secret, no
  count).

Paths in params are relative to the project root (``$CENSUSDP_ROOT``, default two folders up
from this file); Spark jobs run from there with the project's ``.venv`` (``spark_binary``), so the
Airflow environment needs neither pyspark nor the project (``scripts/setup_airflow.sh``).
The Spark connection is ``$CENSUSDP_SPARK_CONN_ID`` (default ``censusdp_spark_local``: local mode,
defined below); the ``spark_conf`` param adds Spark settings to every job. With the
``spark_remote`` param (default ``$CENSUSDP_SPARK_REMOTE``), ``sc://HOST:PORT``, the Spark tasks run
their job with the project's Python and ``--remote`` against that Spark Connect server instead:
no spark-submit, no JVM on the Airflow worker; the server's own settings apply (``spark_conf`` does
not), and it must see the same paths (docs/deploy.md, "Run over Spark Connect").
One release runs at a time (``max_active_runs=1``).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import stat
import string
import subprocess
import tomllib
from datetime import timedelta
from pathlib import Path
from typing import Any

import pendulum
from airflow.exceptions import AirflowException
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.providers.standard.operators.bash import BashOperator
from airflow.sdk import DAG, Param, task

ROOT = Path(os.environ.get("CENSUSDP_ROOT", Path(__file__).resolve().parents[2]))
VENV_BIN = ROOT / ".venv" / "bin"
DELTA_JARS = ",".join(
    str(ROOT / "jars" / j) for j in ("delta-spark_2.13-4.0.0.jar", "delta-storage-4.0.0.jar")
)
CONN_ID = os.environ.get("CENSUSDP_SPARK_CONN_ID", "censusdp_spark_local")
SPARK_REMOTE = os.environ.get("CENSUSDP_SPARK_REMOTE", "")  # sc://HOST:PORT: Spark Connect
# The default connection: local mode on the Airflow worker, unless the worker's environment defines
# it. For a cluster, set CENSUSDP_SPARK_CONN_ID to a connection made in the UI or a secrets backend.
os.environ.setdefault(
    "AIRFLOW_CONN_CENSUSDP_SPARK_LOCAL", json.dumps({"conn_type": "spark", "host": "local[*]"})
)

RUN_DATE = "{{ params.run_date or ds }}"
RELEASE_DIR = "{{ params.output_root }}/" + RUN_DATE
TOPDOWN_OUTPUT = RELEASE_DIR + "/topdown"
PGSR_OUTPUT = RELEASE_DIR + "/pgsr"
SECRET_FILE = (
    "{{ params.secret_file or (var.value.get('censusdp_secret_dir', 'runs/airflow/secrets')"
    " ~ '/' ~ (params.run_date or ds) ~ '/run_secret') }}"
)
SECRET_HEX_CHARS = 64

log = logging.getLogger(__name__)


def project_path(path: str | Path) -> Path:
    """A param path as the jobs see it: relative paths are relative to the project root."""
    return ROOT / path


def without_empty_options(args: list[str]) -> list[str]:
    """Drop ``--flag ""`` pairs: an optional param left empty means "the config's value"."""
    out: list[str] = []
    i = 0
    while i < len(args):
        if args[i].startswith("--") and i + 1 < len(args) and args[i + 1] == "":
            i += 2
            continue
        out.append(args[i])
        i += 1
    return out


def option(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args[:-1] else None


def topdown_state_file(config: Path, output: str | None) -> Path:
    """Where the TopDown job keeps its run state (``censusdp_spark.topdown.job``): beside an
    ``--output`` override, in ``<output>.private/``; else in the config's ``[run] private_dir``
    (default ``runs/<name>``, as in ``censusdp_spark.model.config.RunModel.options``)."""
    if output is not None:
        out = project_path(output)
        return out.parent / f"{out.name}.private" / "state.json"
    run = tomllib.loads(config.read_text()).get("run", {})
    return (
        project_path(run.get("private_dir", f"runs/{run.get('name', config.stem)}")) / "state.json"
    )


def resumable(config: Path, output: str | None) -> bool:
    """True if a TopDown run state exists for this output (the job checks the config matches)."""
    state_file = topdown_state_file(config, output)
    if not state_file.exists():
        return False
    recorded = json.loads(state_file.read_text()).get("output")
    return output is None or recorded == str(Path(output))


def connect_command(python: str, application: str, args: list[str], remote: str) -> list[str]:
    """The job run as a Spark Connect client: the project's Python, ``--remote`` appended."""
    return [python, application, *args, "--remote", remote]


class ReleaseSubmitOperator(SparkSubmitOperator):
    """spark-submit from the project's virtualenv, run from the project root (config paths are
    relative to it), with the DAG's ``spark_conf`` param added to ``conf`` and empty optional
    flags dropped; with the ``spark_remote`` param, the job as a Spark Connect client instead."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("conn_id", CONN_ID)
        kwargs.setdefault("spark_binary", str(VENV_BIN / "spark-submit"))
        kwargs.setdefault("jars", DELTA_JARS)
        kwargs.setdefault("name", f"censusdp-{kwargs['task_id']}")
        super().__init__(**kwargs)

    def prepare_args(self, args: list[str], context: Any) -> list[str]:
        return args

    def execute(self, context: Any) -> None:
        python = str(VENV_BIN / "python")
        self.conf = {
            "spark.pyspark.python": python,
            **(self.conf or {}),
            **(context["params"].get("spark_conf") or {}),
        }
        # find-spark-home and the driver must use the project's interpreter, not Airflow's.
        self.env_vars = {
            "PYSPARK_PYTHON": python,
            "PYSPARK_DRIVER_PYTHON": python,
            **(self.env_vars or {}),
        }
        # Config paths (input, private_dir) resolve against the driver's working directory, which
        # spark-submit inherits from this process; every Airflow task runs in a process of its own.
        previous = Path.cwd()
        os.chdir(ROOT)
        try:
            self.application_args = self.prepare_args(
                without_empty_options(list(self.application_args or [])), context
            )
            remote = str(context["params"].get("spark_remote") or "").strip()
            if remote:
                self.run_over_connect(python, remote)
            else:
                super().execute(context)
        finally:
            os.chdir(previous)

    def run_over_connect(self, python: str, remote: str) -> None:
        """Run the job with ``--remote``; its output goes to the task log as it comes."""
        command = connect_command(python, self.application, list(self.application_args), remote)
        self.log.info("running %s over Spark Connect at %s", self.application, remote)
        with subprocess.Popen(
            command,
            env={**os.environ, **self.env_vars},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        ) as job:
            assert job.stdout is not None
            for line in job.stdout:
                self.log.info("%s", line.rstrip())
        if job.returncode != 0:
            raise AirflowException(f"{self.application} exited with {job.returncode}")


class TopDownSubmitOperator(ReleaseSubmitOperator):
    """Keeps ``--resume`` when there is a run to resume (a retry, or a re-run of this date) and
    drops it on a first start, where the job would refuse it for want of a run state."""

    def prepare_args(self, args: list[str], context: Any) -> list[str]:
        config, output = option(args, "--config"), option(args, "--output")
        if "--resume" in args and config and not resumable(project_path(config), output):
            self.log.info("no TopDown run state for %s: starting a fresh run", output)
            return [a for a in args if a != "--resume"]
        self.log.info("resuming the TopDown run of %s from its last committed step", output)
        return args


class PgsrSubmitOperator(ReleaseSubmitOperator):
    """A retry replaces what an earlier try left unfinished (no manifest): with the same secret
    the noise is the same. A finished release is never overwritten."""

    def prepare_args(self, args: list[str], context: Any) -> list[str]:
        output = option(args, "--output")
        if (
            context["ti"].try_number > 1
            and output
            and not (project_path(output) / "manifest.json").exists()
        ):
            self.log.info("retry: replacing the unfinished group-size release in %s", output)
            return [*args, "--overwrite"]
        return args


def summarise_manifest(manifest: dict[str, Any]) -> dict[str, Any]:
    """What a reviewer needs from a manifest: the secret fingerprint and config text stay out."""
    keep = ("run", "release", "mechanism", "input", "privacy", "nodes", "guarantee_checks")
    summary = {k: manifest[k] for k in keep if k in manifest}
    summary["timings_s"] = {k: round(v, 1) for k, v in manifest.get("timings_s", {}).items()}
    summary["elapsed_s"] = round(manifest.get("elapsed_s", 0.0), 1)
    return summary


def report_lines(name: str, output: Path, summary: dict[str, Any]) -> list[str]:
    """A release's summary as log lines: budget, nodes per level, guarantee checks, timings."""
    privacy = summary.get("privacy", {})
    if "rho" in privacy:
        budget = (
            f"rho = {privacy['rho']} zCDP, epsilon = {privacy['epsilon_tight']:.2f}"
            f" at delta = {privacy['delta']:g}"
        )
    else:
        budget = f"epsilon = {privacy.get('epsilon', '?')} (pure DP)"
    nodes = ", ".join(f"{level} {n}" for level, n in summary.get("nodes", {}).items())
    checks = ", ".join(f"{k} = {v}" for k, v in summary.get("guarantee_checks", {}).items())
    timings = ", ".join(f"{k} {v} s" for k, v in summary["timings_s"].items())
    return [
        f"{name} release {output}: {budget}",
        f"  nodes: {nodes}",
        f"  guarantee checks: {checks}",
        f"  elapsed {summary['elapsed_s']} s ({timings})",
    ]


with DAG(
    dag_id="censusdp_release",
    description="Differentially private census release: validate, TopDown, group sizes, report",
    schedule=os.environ.get("CENSUSDP_RELEASE_SCHEDULE") or None,
    start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    default_args={"retries": 2, "retry_delay": timedelta(minutes=1)},
    params={
        "topdown_config": Param(
            "conf/ri_2010_demo.toml", type="string", description="TopDown config (TOML)"
        ),
        "pgsr_config": Param(
            "conf/pgsr_calm.toml", type="string", description="group-size release config"
        ),
        "input": Param(
            "", type="string", description="TopDown input; empty: the config's [input].path"
        ),
        "pgsr_input": Param("", type="string", description="group-size input; empty: the config's"),
        "pgsr_mechanism": Param(
            "", type="string", description="dp | relaxed | cumulative; empty: the config's"
        ),
        "output_root": Param(
            "output/airflow", type="string", description="releases go to <root>/<run date>/"
        ),
        "run_date": Param(
            "", type="string", description="release date; empty: the run's logical date"
        ),
        "secret_file": Param(
            "",
            type="string",
            description="run secret (64 hex chars, mode 0600); empty: "
            "<Variable censusdp_secret_dir, default runs/airflow/secrets>/<run date>/run_secret",
        ),
        "spark_conf": Param(
            {}, type="object", description="extra Spark settings, e.g. spark.executor.memory"
        ),
        "spark_remote": Param(
            SPARK_REMOTE,
            type="string",
            description="Spark Connect server sc://HOST:PORT; empty: spark-submit on the connection",
        ),
    },
    tags=["censusdp"],
) as dag:
    check_budget = BashOperator(
        task_id="check_budget",
        bash_command=f'"{VENV_BIN}/censusdp" budget --config "$CENSUSDP_CONFIG"',
        env={"CENSUSDP_CONFIG": "{{ params.topdown_config }}"},
        append_env=True,
        cwd=str(ROOT),
    )

    @task
    def ensure_secret(secret_file: str) -> str:
        """Create the run secret once (0600, in a 0700 folder) or check the existing one; the
        secret is never logged."""
        path = project_path(secret_file)
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            mode = stat.S_IMODE(path.stat().st_mode)
            if mode & 0o077:
                raise PermissionError(
                    f"{path}: mode {mode:#o} lets group or others read the run secret"
                ) from None
            text = path.read_text().strip()
            if len(text) != SECRET_HEX_CHARS or not all(c in string.hexdigits for c in text):
                raise ValueError(
                    f"{path}: a run secret must be {SECRET_HEX_CHARS} hex characters"
                ) from None
            log.info("using the existing run secret %s", path)
            return str(path)
        with os.fdopen(fd, "w") as handle:
            handle.write(secrets.token_hex(SECRET_HEX_CHARS // 2) + "\n")
        log.info("created the run secret %s", path)
        return str(path)

    validate_input = ReleaseSubmitOperator(
        task_id="validate_input",
        application=str(ROOT / "censusdp_spark" / "topdown" / "validate.py"),
        application_args=[
            "--config", "{{ params.topdown_config }}",
            "--input", "{{ params.input }}",
            "--secret-file", SECRET_FILE,
        ],
    )  # fmt: skip

    topdown = TopDownSubmitOperator(
        task_id="topdown",
        application=str(ROOT / "jobs" / "topdown.py"),
        application_args=[
            "--config", "{{ params.topdown_config }}",
            "--input", "{{ params.input }}",
            "--output", TOPDOWN_OUTPUT,
            "--secret-file", SECRET_FILE,
            "--resume",
        ],
        retries=3,
    )  # fmt: skip

    pgsr = PgsrSubmitOperator(
        task_id="pgsr",
        application=str(ROOT / "jobs" / "pgsr.py"),
        application_args=[
            "--config", "{{ params.pgsr_config }}",
            "--input", "{{ params.pgsr_input }}",
            "--mechanism", "{{ params.pgsr_mechanism }}",
            "--output", PGSR_OUTPUT,
            "--secret-file", SECRET_FILE,
        ],
    )  # fmt: skip

    @task
    def report(topdown_output: str, pgsr_output: str) -> dict[str, Any]:
        """Log each release's manifest summary; returned as the task's XCom."""
        summaries = {}
        for name, output in (("topdown", topdown_output), ("pgsr", pgsr_output)):
            folder = project_path(output)
            summary = summarise_manifest(json.loads((folder / "manifest.json").read_text()))
            for line in report_lines(name, folder, summary):
                log.info("%s", line)
            summaries[name] = summary
        return summaries

    secret = ensure_secret(SECRET_FILE)
    check_budget >> secret >> validate_input >> topdown >> pgsr
    pgsr >> report(TOPDOWN_OUTPUT, PGSR_OUTPUT)
