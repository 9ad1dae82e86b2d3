"""From a suite, targets, filters and --set to a run's jobs: the suite and inventory files, the CPU a binary is built for, the plan, and the run's plain data."""
