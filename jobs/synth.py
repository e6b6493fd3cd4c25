"""spark-submit entry point for hierarchical synthetic data (same arguments as ``censusdp synth``).

    spark-submit --master spark://HOST:7077 \
        --jars jars/delta-spark_2.13-4.0.0.jar,jars/delta-storage-4.0.0.jar \
        jobs/synth.py --config conf/synth_pums.toml --method hpd_fixed --epsilon 1 --delta 5.6e-8
"""

import sys

from censusdp_spark.cli import main

if __name__ == "__main__":
    sys.exit(main(["synth", *sys.argv[1:]]))
