"""The local-mode session: every listener, the Spark UI included, on the loopback address."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse

import pytest

PROBE = """
import json, os, socket
from pathlib import Path
from urllib.parse import urlparse
from censusdp_spark.engine.session import spark_session

spark = spark_session("ui-probe", "local[1]")
port = urlparse(spark.sparkContext.uiWebUrl).port


def accepts(host):
    try:
        socket.create_connection((host, port), timeout=5).close()
        return True
    except OSError:
        return False


print(json.dumps({"url": spark.sparkContext.uiWebUrl, "port": port,
                  "loopback": accepts("127.0.0.1"), "outside": accepts(OUTSIDE),
                  "leaked": "SPARK_LOCAL_IP" in os.environ}))
spark.stop()
"""


def outside_address() -> str | None:
    """This machine's address on its default route (no packet is sent), if not loopback."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))
            address = probe.getsockname()[0]
        except OSError:
            return None
    return None if address.startswith("127.") else address


def test_the_spark_ui_listens_on_loopback_only_in_local_mode():
    outside = outside_address()
    if outside is None:
        pytest.skip("this machine has no non-loopback IPv4 address to probe")
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_LOCAL_IP", "CENSUSDP_UI_HOST")}
    probe = subprocess.run(
        [sys.executable, "-c", PROBE.replace("OUTSIDE", repr(outside))],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert probe.returncode == 0, probe.stderr[-3000:]
    seen = json.loads(probe.stdout.strip().splitlines()[-1])
    assert urlparse(seen["url"]).hostname == "127.0.0.1"
    assert seen["loopback"], "the UI does not answer on 127.0.0.1"
    assert not seen["outside"], f"the UI answers on {outside}:{seen['port']}"
    assert not seen["leaked"], "SPARK_LOCAL_IP stays set for processes started later"


def test_no_release_names_its_spark_jobs_with_data():
    """The UI names a job by its description or group when one is set, else by its call site:
    no code sets one, so no count can reach the UI that way."""
    package = Path(__file__).resolve().parents[2] / "censusdp_spark"
    setters = ("setJobDescription", "setJobGroup", "setLocalProperty", "spark.job.description")
    found = [
        f"{path.relative_to(package)}: {name}"
        for path in package.rglob("*.py")
        for name in setters
        if name in path.read_text()
    ]
    assert found == []
