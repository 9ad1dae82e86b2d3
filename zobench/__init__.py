"""The `zobench` command. It sits above the two libraries it drives: `harness` plans, runs
and stores jobs, and `reports` reads the store; neither imports this package or the other's
callers, so the data flows one way (workloads -> harness -> reports -> zobench)."""
