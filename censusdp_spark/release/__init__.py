"""Release jobs: orchestration of the engines for one run, shared by the CLI and spark-submit."""
