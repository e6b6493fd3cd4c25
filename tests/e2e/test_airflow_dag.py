"""The Airflow DAG ``censusdp_release`` (jobs/airflow/): it loads, its tasks and retries are wired
as promised, a retry resumes TopDown rather than redrawing, and its TopDown task runs end to end.

Airflow lives in its own virtualenv (``scripts/setup_airflow.sh``, run here if needed); every check
runs there, in a subprocess, with ``AIRFLOW_HOME`` in a temporary folder.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.airflow

ROOT = Path(__file__).resolve().parents[2]
AIRFLOW_VENV = ROOT / ".venv-airflow"
DAG_FOLDER = ROOT / "jobs" / "airflow"
RUN_DATE = "2024-01-01"
SPARK_CONF = {
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.sql.shuffle.partitions": "4",
    "spark.ui.enabled": "false",
}


@pytest.fixture(scope="module")
def airflow_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The Airflow venv (installed if missing or stale) and an environment for a throwaway home."""
    subprocess.run(["bash", str(ROOT / "scripts" / "setup_airflow.sh")], check=True, timeout=900)
    home = tmp_path_factory.mktemp("airflow_home")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK_GATEWAY", "AIRFLOW"))}
    env.update(
        AIRFLOW_HOME=str(home),
        AIRFLOW__CORE__DAGS_FOLDER=str(DAG_FOLDER),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW_CONN_CENSUSDP_SPARK_LOCAL=json.dumps({"conn_type": "spark", "host": "local[2]"}),
        SPARK_LOCAL_IP="127.0.0.1",
    )
    return env


def airflow_python(env: dict[str, str], script: str, cwd: Path) -> dict:
    """Run ``script`` with the Airflow venv's Python; it prints one JSON object as its last line."""
    done = subprocess.run(
        [str(AIRFLOW_VENV / "bin" / "python"), "-c", textwrap.dedent(script)],
        env=env, cwd=cwd, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


DAG_FACTS = """
    import json
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder={folder!r})
    dag = bag.dags.get("censusdp_release")
    tasks = {{}}
    for t in (dag.tasks if dag else []):
        tasks[t.task_id] = {{
            "upstream": sorted(t.upstream_task_ids),
            "retries": t.retries,
            "application": getattr(t, "application", None),
            "application_args": getattr(t, "application_args", None),
            "jars": getattr(t, "jars", None),
            "spark_binary": getattr(t, "_spark_binary", None),
            "conn_id": getattr(t, "_conn_id", None),
        }}
    print(json.dumps({{
        "import_errors": {{str(k): str(v) for k, v in bag.import_errors.items()}},
        "tasks": tasks,
        "params": dict(dag.params) if dag else {{}},
    }}))
"""


@pytest.fixture(scope="module")
def dag_facts(airflow_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> dict:
    return airflow_python(
        airflow_env, DAG_FACTS.format(folder=str(DAG_FOLDER)), tmp_path_factory.mktemp("dagbag")
    )


def test_dag_imports_without_errors(dag_facts: dict) -> None:
    assert dag_facts["import_errors"] == {}
    assert dag_facts["tasks"], "the DagBag holds no censusdp_release DAG"


def test_tasks_run_in_release_order(dag_facts: dict) -> None:
    order = ["check_budget", "ensure_secret", "validate_input", "topdown", "pgsr", "report"]
    tasks = dag_facts["tasks"]
    assert set(tasks) == set(order)
    for before, after in zip(order, order[1:], strict=False):
        assert tasks[after]["upstream"] == [before]
    assert tasks[order[0]]["upstream"] == []


def test_spark_tasks_submit_the_repo_jobs_with_delta_jars_from_the_project_venv(
    dag_facts: dict,
) -> None:
    tasks = dag_facts["tasks"]
    assert tasks["topdown"]["application"] == str(ROOT / "jobs" / "topdown.py")
    assert tasks["pgsr"]["application"] == str(ROOT / "jobs" / "pgsr.py")
    for name in ("validate_input", "topdown", "pgsr"):
        jars = tasks[name]["jars"].split(",")
        assert sorted(Path(j).name for j in jars) == [
            "delta-spark_2.13-4.0.0.jar",
            "delta-storage-4.0.0.jar",
        ]
        assert all(Path(j).is_file() for j in jars)
        assert tasks[name]["spark_binary"] == str(ROOT / ".venv" / "bin" / "spark-submit")
        assert tasks[name]["conn_id"] == "censusdp_spark_local"


def test_topdown_retries_resume_with_a_secret_kept_outside_the_task(dag_facts: dict) -> None:
    topdown = dag_facts["tasks"]["topdown"]
    assert topdown["retries"] >= 1
    assert "--resume" in topdown["application_args"]
    assert "--overwrite" not in topdown["application_args"]
    secret_arg = topdown["application_args"][topdown["application_args"].index("--secret-file") + 1]
    assert "params.secret_file" in secret_arg and "censusdp_secret_dir" in secret_arg
    assert all(t["retries"] >= 1 for n, t in dag_facts["tasks"].items() if n != "report")


def test_params_name_both_configs_and_the_run_date(dag_facts: dict) -> None:
    params = dag_facts["params"]
    assert params["topdown_config"] == "conf/ri_2010_demo.toml"
    assert params["pgsr_config"] == "conf/pgsr_calm.toml"
    assert {"input", "output_root", "run_date", "secret_file", "spark_conf"} <= set(params)
    assert params["spark_remote"] == ""  # spark-submit on the Spark connection unless set


OPERATOR_RULES = """
    import json, os, stat, sys
    from pathlib import Path
    sys.path.insert(0, {folder!r})
    import censusdp_release as release

    tmp = Path.cwd()
    config = tmp / "c.toml"
    config.write_text('[run]\\nname = "x"\\n')
    out = str(tmp / "out" / "topdown")
    args = ["--config", str(config), "--input", "", "--output", out, "--secret-file", "s"]
    args.append("--resume")
    op = release.TopDownSubmitOperator(task_id="t", application="a.py", application_args=args)
    facts = {{"dropped_empty": release.without_empty_options(args)}}
    facts["fresh"] = op.prepare_args(release.without_empty_options(args), {{}})
    state = tmp / "out" / "topdown.private" / "state.json"
    state.parent.mkdir(parents=True)
    state.write_text(json.dumps({{"output": str(tmp / "other")}}))
    facts["other_output"] = op.prepare_args(list(args), {{}})
    state.write_text(json.dumps({{"output": out}}))
    facts["retry"] = op.prepare_args(list(args), {{}})

    class TI:
        def __init__(self, n):
            self.try_number = n
    pgsr = release.PgsrSubmitOperator(task_id="p", application="a.py", application_args=[])
    pgsr_args = ["--config", "c", "--output", str(tmp / "pgsr")]
    facts["pgsr_first"] = pgsr.prepare_args(list(pgsr_args), {{"ti": TI(1)}})
    facts["pgsr_retry"] = pgsr.prepare_args(list(pgsr_args), {{"ti": TI(2)}})
    (tmp / "pgsr").mkdir()
    (tmp / "pgsr" / "manifest.json").write_text("{{}}")
    facts["pgsr_retry_finished"] = pgsr.prepare_args(list(pgsr_args), {{"ti": TI(2)}})

    made = release.ensure_secret.function(str(tmp / "secrets" / "2024-01-01" / "run_secret"))
    facts["secret_mode"] = oct(stat.S_IMODE(os.stat(made).st_mode))
    facts["secret_text"] = Path(made).read_text()
    facts["secret_again"] = release.ensure_secret.function(made)
    facts["secret_kept"] = Path(made).read_text() == facts["secret_text"]

    manifest = {{"run": "r", "privacy": {{"rho": "1/2", "epsilon_tight": 3.0, "delta": 1e-10}},
                 "nodes": {{"nation": 1}}, "guarantee_checks": {{"negative_counts": 0}},
                 "timings_s": {{"measure": 1.234}}, "elapsed_s": 2.0,
                 "secret_fingerprint": "FINGERPRINT", "config_text": "CONFIG_TEXT"}}
    for name in ("td", "gs"):
        (tmp / name).mkdir()
        (tmp / name / "manifest.json").write_text(json.dumps(manifest))
    facts["report"] = release.report.function(str(tmp / "td"), str(tmp / "gs"))
    facts["connect"] = release.connect_command("py", "a.py", ["--config", "c"], "sc://h:1")
    print(json.dumps(facts))
"""


@pytest.fixture(scope="module")
def operator_rules(airflow_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> dict:
    return airflow_python(
        airflow_env, OPERATOR_RULES.format(folder=str(DAG_FOLDER)), tmp_path_factory.mktemp("rules")
    )


def test_empty_optional_params_are_left_out(operator_rules: dict) -> None:
    assert "--input" not in operator_rules["dropped_empty"]
    assert "--output" in operator_rules["dropped_empty"]


def test_a_first_start_runs_fresh_and_a_retry_resumes(operator_rules: dict) -> None:
    assert "--resume" not in operator_rules["fresh"]
    assert "--resume" not in operator_rules["other_output"]
    assert "--resume" in operator_rules["retry"]


def test_a_pgsr_retry_replaces_only_an_unfinished_output(operator_rules: dict) -> None:
    assert "--overwrite" not in operator_rules["pgsr_first"]
    assert "--overwrite" in operator_rules["pgsr_retry"]
    assert "--overwrite" not in operator_rules["pgsr_retry_finished"]


def test_the_run_secret_is_created_once_owner_only(operator_rules: dict) -> None:
    assert operator_rules["secret_mode"] == "0o600"
    assert len(operator_rules["secret_text"].strip()) == 64
    int(operator_rules["secret_text"], 16)
    assert operator_rules["secret_kept"]


def test_the_report_summarises_manifests_without_secret_or_config_text(
    operator_rules: dict,
) -> None:
    report = operator_rules["report"]
    assert set(report) == {"topdown", "pgsr"}
    assert report["topdown"]["privacy"]["rho"] == "1/2"
    assert report["topdown"]["timings_s"] == {"measure": 1.2}
    assert "FINGERPRINT" not in json.dumps(report) and "CONFIG_TEXT" not in json.dumps(report)


def test_a_spark_connect_run_is_the_job_with_remote_and_no_spark_submit(
    operator_rules: dict,
) -> None:
    assert operator_rules["connect"] == ["py", "a.py", "--config", "c", "--remote", "sc://h:1"]


def bristol_county_blocks(folder: Path) -> Path:
    """The 1,092 real 2010 blocks of Bristol County, RI (geocodes 44001...), with the header."""
    source = (ROOT / "data" / "ri_2010_blocks_pl.csv").read_text().splitlines()
    county = [source[0]] + [line for line in source[1:] if line.startswith("44001")]
    path = folder / "bristol_county_blocks.csv"
    path.write_text("\n".join(county) + "\n")
    return path


def test_validate_step_checks_config_input_and_secret_and_writes_nothing(
    spark, tmp_path: Path, secret_file: Path
) -> None:
    from censusdp_spark.topdown.config import load_topdown_config
    from censusdp_spark.topdown.validate import validate_release

    blocks = bristol_county_blocks(tmp_path)
    before = sorted(tmp_path.rglob("*"))
    report = validate_release(
        spark, load_topdown_config(ROOT / "conf" / "ri_2010_demo.toml", ROOT), blocks, secret_file
    )
    assert report.blocks == 1092
    assert report.nodes == {
        "nation": 1,
        "state": 1,
        "county": 1,
        "tract": 11,
        "block_group": 38,
        "block": 1092,
    }
    assert "owner-only" in report.text() and "ab" * 32 not in report.text()
    assert sorted(tmp_path.rglob("*")) == before


def test_validate_step_names_the_row_of_a_broken_input(spark, tmp_path: Path) -> None:
    from censusdp_spark.model.errors import InputError
    from censusdp_spark.topdown.config import load_topdown_config
    from censusdp_spark.topdown.validate import validate_release

    blocks = bristol_county_blocks(tmp_path)
    lines = blocks.read_text().splitlines()
    fields = lines[3].split(",")  # data row 3
    assert lines[0].split(",")[5] == "pop_white"
    fields[5] = "-1"
    lines[3] = ",".join(fields)
    blocks.write_text("\n".join(lines) + "\n")
    with pytest.raises(
        InputError, match="row 3, column pop_white: count must be a non-negative integer"
    ):
        validate_release(
            spark, load_topdown_config(ROOT / "conf" / "ri_2010_demo.toml", ROOT), blocks
        )


def test_topdown_task_runs_end_to_end_in_local_mode(
    airflow_env: dict[str, str], quick_tract: tuple[Path, Path], tmp_path: Path
) -> None:
    """``airflow tasks test`` runs the TopDown task on a real RI tract (125 blocks) with the
    demo's schema over three levels: the task's wiring, not the hierarchy's depth."""
    blocks, quick_config = quick_tract
    # The config with its own output and private folder, so no other run state is touched.
    config = tmp_path / "topdown.toml"
    text = quick_config.read_text()
    for key, value in (
        ("output", tmp_path / "config_output"),
        ("private_dir", tmp_path / "private"),
    ):
        text, found = re.subn(rf"^{key} = .*$", f'{key} = "{value}"', text, count=1, flags=re.M)
        assert found == 1, key
    config.write_text(text)
    secret = secrets.token_hex(32)
    secret_file = tmp_path / "secret.hex"
    secret_file.write_text(secret)
    secret_file.chmod(0o600)
    params = {
        "topdown_config": str(config),
        "input": str(blocks),
        "output_root": str(tmp_path / "releases"),
        "secret_file": str(secret_file),
        "spark_conf": SPARK_CONF,
    }
    airflow = str(AIRFLOW_VENV / "bin" / "airflow")
    migrate = subprocess.run(
        [airflow, "db", "migrate"], env=airflow_env, cwd=tmp_path, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert migrate.returncode == 0, migrate.stdout[-2000:] + migrate.stderr[-2000:]
    run = subprocess.run(
        [airflow, "tasks", "test", "censusdp_release", "topdown", RUN_DATE,
         "-t", json.dumps(params)],
        env=airflow_env, cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-5000:]
    assert secret not in log

    output = tmp_path / "releases" / RUN_DATE / "topdown"
    for table in ("noisy_measurements", "estimates", "microdata"):
        assert (output / table / "_delta_log").is_dir(), table
    manifest = json.loads((output / "manifest.json").read_text())
    assert manifest["input"] == str(blocks)
    assert manifest["nodes"]["block"] == 125
    assert manifest["privacy"]["rho"] == "1"
    assert secret not in json.dumps(manifest)
    # The DAG finds the run state where the job wrote it: a retry would resume this run.
    resumable = airflow_python(
        airflow_env,
        f"""
        import json, sys
        sys.path.insert(0, {str(DAG_FOLDER)!r})
        from censusdp_release import resumable
        print(json.dumps({{"resumable": resumable({str(config)!r}, {str(output)!r})}}))
        """,
        tmp_path,
    )
    assert resumable == {"resumable": True}
