"""spark-submit entry point for the group-size release (same arguments as ``censusdp pgsr``).

    spark-submit --master spark://HOST:7077 --jars jars/delta-spark_2.13-4.0.0.jar,jars/delta-storage-4.0.0.jar \
        jobs/pgsr.py --config conf/pgsr_calm.toml --mechanism dp
"""

import sys

from censusdp_spark.cli import main

if __name__ == "__main__":
    sys.exit(main(["pgsr", *sys.argv[1:]]))
