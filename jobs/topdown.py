"""spark-submit entry point for the TopDown release (same arguments as ``censusdp topdown``).

    spark-submit --master spark://HOST:7077 --jars jars/delta-spark_2.13-4.0.0.jar,jars/delta-storage-4.0.0.jar \
        jobs/topdown.py --config conf/ri_2010_demo.toml
"""

import sys

from censusdp_spark.cli import main

if __name__ == "__main__":
    sys.exit(main(["topdown", *sys.argv[1:]]))
